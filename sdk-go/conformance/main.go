// Command conformance is the Go runner of the conformance scenarios
// (conformance/scenarios.json at the repository root).
//
// It performs every scenario's steps with the Go SDK against the cluster at
// $OPENSHELL_ENDPOINT and reports what it observed, one JSON line per step
// (format: conformance/README.md, "Observations"). It never reads a step's
// expect: the harness judges every runner in one place.
//
// Usage: openshell-conformance-go [SCENARIOS_JSON] [--only ID ...]
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

const (
	stepLimit = 120 * time.Second
	textLimit = 4096
)

var placeholder = regexp.MustCompile(`\$\{([a-z][a-z0-9]*)\}`)

type step map[string]any

type scenario struct {
	ID       string   `json:"id"`
	Requires []string `json:"requires"`
	Uses     []string `json:"uses"`
	Steps    []step   `json:"steps"`
}

type result map[string]any

// stepFailed is a failure of the runner itself (not an SDK error).
type stepFailed struct{ msg string }

func (e *stepFailed) Error() string { return e.msg }

func fail(format string, args ...any) error { return &stepFailed{fmt.Sprintf(format, args...)} }

var out = bufio.NewWriter(os.Stdout)

func emit(line map[string]any) {
	b, err := json.Marshal(line)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"type": "step", "failure": "unencodable observation: " + err.Error()})
	}
	out.Write(b)
	out.WriteByte('\n')
	out.Flush()
}

func text(r result, field string, data []byte) {
	shown := data
	if len(shown) > textLimit {
		shown = shown[:textLimit]
	}
	r[field] = strings.ToValidUTF8(string(shown), string(utf8.RuneError))
	r[field+"_bytes"] = len(data)
}

type runner struct {
	endpoint string
	dataDir  string
	runID    string
	prefix   string
	client   *openshell.Client
	named    map[string]bool
	ready    map[string]bool
	control  string
	caps     []string
}

func (r *runner) name(alias string) string {
	n := r.prefix + alias
	r.named[n] = true
	return n
}

func (r *runner) subst(v any) any {
	switch x := v.(type) {
	case string:
		return placeholder.ReplaceAllStringFunc(x, func(m string) string {
			alias := placeholder.FindStringSubmatch(m)[1]
			if alias == "run" {
				return r.runID
			}
			return r.name(alias)
		})
	case []any:
		outs := make([]any, len(x))
		for i, e := range x {
			outs[i] = r.subst(e)
		}
		return outs
	case map[string]any:
		outs := make(map[string]any, len(x))
		for k, e := range x {
			outs[r.subst(k).(string)] = r.subst(e)
		}
		return outs
	}
	return v
}

func (r *runner) target(s step) string {
	if n, ok := s["name"]; ok {
		return fmt.Sprint(r.subst(n))
	}
	if a, ok := s["sandbox"].(string); ok {
		return r.name(a)
	}
	return r.name("main")
}

func (r *runner) ensure(alias string) error {
	if r.ready[alias] {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	name := r.name(alias)
	if _, err := r.client.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: name}); err != nil && !errors.Is(err, openshell.ErrAlreadyExists) {
		return err
	}
	if _, err := r.client.Sandboxes().WaitReady(ctx, name); err != nil {
		return err
	}
	r.ready[alias] = true
	return nil
}

func (r *runner) cleanup() {
	names := make([]string, 0, len(r.named))
	for n := range r.named {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if _, err := r.client.Sandboxes().Delete(ctx, n); err == nil {
			_ = r.client.Sandboxes().WaitDeleted(ctx, n)
		}
		cancel()
	}
	r.client.Close()
}

func (r *runner) run(sc scenario) {
	var missing []string
	for _, c := range sc.Requires {
		if !slices.Contains(r.caps, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		emit(map[string]any{"type": "skip", "scenario": sc.ID, "missing": missing})
		return
	}
	for _, alias := range sc.Uses {
		if err := r.ensure(alias); err != nil {
			emit(map[string]any{"type": "setup", "scenario": sc.ID, "alias": alias, "failure": err.Error()})
			return
		}
	}
	for i, s := range sc.Steps {
		started := time.Now()
		outcome := r.perform(s)
		line := map[string]any{"type": "step", "scenario": sc.ID, "step": i, "op": s["op"], "ms": time.Since(started).Milliseconds()}
		for k, v := range outcome {
			line[k] = v
		}
		emit(line)
	}
}

func (r *runner) perform(s step) map[string]any {
	opName, _ := s["op"].(string)
	op, ok := ops[opName]
	if !ok {
		return map[string]any{"failure": fmt.Sprintf("this runner does not know op '%s'", opName)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepLimit)
	defer cancel()
	res, err := op(ctx, r, s)
	if err == nil {
		return map[string]any{"result": res}
	}
	var e *openshell.Error
	if errors.As(err, &e) && !(ctx.Err() != nil && (e.Code == "cancelled" || e.Code == "deadline_exceeded")) {
		var servedBy any
		if e.ServedBy != "" {
			servedBy = e.ServedBy
		}
		return map[string]any{"error": map[string]any{
			"code": e.Code, "grpc_status": int(e.GRPCStatus), "message": e.Error(),
			"retryable": e.Retryable, "served_by": servedBy,
		}}
	}
	if ctx.Err() != nil {
		return map[string]any{"failure": fmt.Sprintf("timed out after %d s", int(stepLimit.Seconds()))}
	}
	return map[string]any{"failure": err.Error()}
}

type op func(ctx context.Context, r *runner, s step) (result, error)

func strs(v any) []string {
	list, _ := v.([]any)
	outs := make([]string, 0, len(list))
	for _, e := range list {
		outs = append(outs, fmt.Sprint(e))
	}
	return outs
}

func strMap(r *runner, v any) map[string]string {
	m, ok := r.subst(v).(map[string]any)
	if !ok {
		return nil
	}
	outs := make(map[string]string, len(m))
	for k, e := range m {
		outs[k] = fmt.Sprint(e)
	}
	return outs
}

func seconds(v any) time.Duration {
	f, ok := v.(float64)
	if !ok {
		return 0
	}
	return time.Duration(f * float64(time.Second))
}

func number(v any) int {
	f, _ := v.(float64)
	return int(f)
}

func withTimeout(ctx context.Context, v any) (context.Context, context.CancelFunc) {
	if d := seconds(v); d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

func execRequest(r *runner, s step) openshell.ExecRequest {
	req := openshell.ExecRequest{
		Sandbox:     r.target(s),
		Command:     strs(r.subst(s["command"])),
		Environment: strMap(r, s["env"]),
		Timeout:     seconds(s["exec_timeout"]),
	}
	if in, ok := s["stdin"].(string); ok {
		req.Stdin = []byte(in)
	}
	if n, ok := s["stdin_size"].(float64); ok {
		req.Stdin = make([]byte, int(n))
	}
	return req
}

func execOp(ctx context.Context, r *runner, s step) (result, error) {
	o, err := r.client.Exec(ctx, execRequest(r, s))
	if err != nil {
		return nil, err
	}
	res := result{"exit_code": o.ExitCode}
	text(res, "stdout", o.Stdout)
	text(res, "stderr", o.Stderr)
	return res, nil
}

func counters(r *runner) map[string]any {
	s := r.client.RoutingStats()
	return map[string]any{"hinted": s.Hinted, "unrouted_retry": s.UnroutedRetries}
}

func askHarness(control, request string) error {
	conn, err := net.DialTimeout("tcp", control, 10*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write([]byte(request + "\n")); err != nil {
		return err
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fail("the harness did not answer '%s': %v", request, err)
	}
	if strings.TrimSpace(answer) != "ok" {
		return fail("the harness refused '%s': %s", request, strings.TrimSpace(answer))
	}
	return nil
}

var service = openshellv1.File_openshell_openshell_proto.Services().ByName("OpenShell")

func method(name string) (protoreflect.MethodDescriptor, string, error) {
	m := service.Methods().ByName(protoreflect.Name(name))
	if m == nil {
		return nil, "", fail("no method %s in the service", name)
	}
	return m, fmt.Sprintf("/%s/%s", service.FullName(), m.Name()), nil
}

func encode(r *runner, desc protoreflect.MessageDescriptor, body any) (proto.Message, error) {
	msg := dynamicpb.NewMessage(desc)
	if body == nil {
		body = map[string]any{}
	}
	b, err := json.Marshal(r.subst(body))
	if err != nil {
		return nil, err
	}
	if err := protojson.Unmarshal(b, msg); err != nil {
		return nil, fail("the step's message does not parse as %s: %v", desc.FullName(), err)
	}
	return msg, nil
}

var ops = map[string]op{
	"create_sandbox": func(ctx context.Context, r *runner, s step) (result, error) {
		sb, err := r.client.Sandboxes().Create(ctx, openshell.CreateSandbox{
			Name: r.target(s), Environment: strMap(r, s["env"]), Labels: strMap(r, s["labels"]),
		})
		if err != nil {
			return nil, err
		}
		if a, ok := s["sandbox"].(string); ok {
			delete(r.ready, a)
		}
		labels := sb.Labels
		if labels == nil {
			labels = map[string]string{}
		}
		return result{"name": sb.Name, "phase": string(sb.Phase), "labels": labels}, nil
	},
	"wait_ready": func(ctx context.Context, r *runner, s step) (result, error) {
		ctx, cancel := withTimeout(ctx, s["timeout"])
		defer cancel()
		sb, err := r.client.Sandboxes().WaitReady(ctx, r.target(s))
		if err != nil {
			return nil, err
		}
		return result{"name": sb.Name, "phase": string(sb.Phase)}, nil
	},
	"get_sandbox": func(ctx context.Context, r *runner, s step) (result, error) {
		sb, err := r.client.Sandboxes().Get(ctx, r.target(s))
		if err != nil {
			return nil, err
		}
		return result{"name": sb.Name, "phase": string(sb.Phase)}, nil
	},
	"list_sandboxes": func(ctx context.Context, r *runner, s step) (result, error) {
		sel, _ := r.subst(s["label_selector"]).(string)
		list, err := r.client.Sandboxes().List(ctx, openshell.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		names := make([]string, 0, len(list))
		for _, sb := range list {
			names = append(names, sb.Name)
		}
		return result{"names": names}, nil
	},
	"delete_sandbox": func(ctx context.Context, r *runner, s step) (result, error) {
		_, err := r.client.Sandboxes().Delete(ctx, r.target(s))
		return result{}, err
	},
	"wait_deleted": func(ctx context.Context, r *runner, s step) (result, error) {
		ctx, cancel := withTimeout(ctx, s["timeout"])
		defer cancel()
		return result{}, r.client.Sandboxes().WaitDeleted(ctx, r.target(s))
	},
	"client_health": func(ctx context.Context, r *runner, s step) (result, error) {
		other, err := openshell.Dial(ctx, fmt.Sprint(s["endpoint"]), openshell.WithConnectTimeout(2*time.Second))
		if err != nil {
			return nil, err
		}
		defer other.Close()
		_, err = other.Health(ctx)
		return result{}, err
	},
	"exec": execOp,
	"exec_stream": func(ctx context.Context, r *runner, s step) (result, error) {
		st, err := r.client.ExecStream(ctx, execRequest(r, s))
		if err != nil {
			return nil, err
		}
		defer st.Close()
		var stdout, stderr bytes.Buffer
		var exitCode any
		events, exits := 0, 0
		var last any
		for {
			ev, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			events++
			switch {
			case ev.Exited:
				exits++
				exitCode = ev.ExitCode
				last = "exit"
			case ev.Stderr != nil:
				stderr.Write(ev.Stderr)
				last = "stderr"
			default:
				stdout.Write(ev.Stdout)
				last = "stdout"
			}
		}
		res := result{"exit_code": exitCode, "events": events, "exit_events": exits, "last_event": last}
		text(res, "stdout", stdout.Bytes())
		text(res, "stderr", stderr.Bytes())
		return res, nil
	},
	"exec_repeat": func(ctx context.Context, r *runner, s step) (result, error) {
		runs := []result{}
		for range number(s["count"]) {
			o, err := r.client.Exec(ctx, execRequest(r, s))
			if err != nil {
				return nil, err
			}
			run := result{"exit_code": o.ExitCode}
			text(run, "stdout", o.Stdout)
			runs = append(runs, run)
		}
		return result{"runs": runs}, nil
	},
	"routing_stats_delta": func(ctx context.Context, r *runner, s step) (result, error) {
		before := counters(r)
		for range number(s["count"]) {
			if _, err := r.client.Exec(ctx, execRequest(r, s)); err != nil {
				return nil, err
			}
		}
		return result{"routing_before": before, "routing_after": counters(r)}, nil
	},
	"unroute_owner_then_exec": func(ctx context.Context, r *runner, s step) (result, error) {
		if r.control == "" {
			return nil, fail("no OPENSHELL_CONFORMANCE_CONTROL")
		}
		name := r.target(s)
		var header [][2]string
		if _, err := r.client.Raw().GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name},
			openshell.WithMetadata("x-openshell-want-owner", "1"), openshell.Header(&header)); err != nil {
			return nil, err
		}
		owner := ""
		for _, kv := range header {
			if kv[0] == "x-openshell-owner" {
				owner = kv[1]
			}
		}
		if owner == "" {
			return nil, fail("GetSandbox %s named no owner replica", name)
		}
		if err := askHarness(r.control, "unroute "+owner); err != nil {
			return nil, err
		}
		before := counters(r)
		res, err := execOp(ctx, r, s)
		after := counters(r)
		if rerr := askHarness(r.control, "restore"); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			return nil, err
		}
		res["unrouted_replica"] = owner
		res["routing_before"] = before
		res["routing_after"] = after
		return res, nil
	},
	"interactive":    interactiveOp,
	"config_session": configSessionOp,
	"forward":        forwardOp,
	"raw_unary": func(ctx context.Context, r *runner, s step) (result, error) {
		m, path, err := method(fmt.Sprint(s["method"]))
		if err != nil {
			return nil, err
		}
		req, err := encode(r, m.Input(), s["request"])
		if err != nil {
			return nil, err
		}
		var opts []openshell.CallOption
		md, _ := r.subst(s["metadata"]).([]any)
		for _, kv := range md {
			pair := strs(kv)
			if len(pair) == 2 {
				opts = append(opts, openshell.WithMetadata(pair[0], pair[1]))
			}
		}
		var header [][2]string
		opts = append(opts, openshell.Header(&header))
		resp := dynamicpb.NewMessage(m.Output())
		if err := r.client.Raw().Invoke(ctx, path, req, resp, opts...); err != nil {
			return nil, err
		}
		body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
		if err != nil {
			return nil, err
		}
		var response any
		if err := json.Unmarshal(body, &response); err != nil {
			return nil, err
		}
		pairs := make([][]string, 0, len(header))
		for _, kv := range header {
			pairs = append(pairs, []string{kv[0], kv[1]})
		}
		return result{"metadata": pairs, "response": response}, nil
	},
	"raw_stream": func(ctx context.Context, r *runner, s step) (result, error) {
		m, path, err := method(fmt.Sprint(s["method"]))
		if err != nil {
			return nil, err
		}
		st, err := r.client.Raw().NewStream(ctx, path, func() proto.Message { return dynamicpb.NewMessage(m.Output()) })
		if err != nil {
			return nil, err
		}
		defer st.Close()
		msgs, _ := s["messages"].([]any)
		for _, body := range msgs {
			msg, err := encode(r, m.Input(), body)
			if err != nil {
				return nil, err
			}
			if err := st.Send(ctx, msg); err != nil {
				return nil, err
			}
		}
		st.CloseSend()
		received := 0
		for {
			_, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			received++
		}
		return result{"received": received}, nil
	},
}

func interactiveOp(ctx context.Context, r *runner, s step) (result, error) {
	req := openshell.ExecRequest{Sandbox: r.target(s), Command: strs(r.subst(s["command"]))}
	if s["tty"] == true {
		req.TTY = true
		req.Cols, req.Rows = 80, 24
		if c, ok := s["cols"].(float64); ok {
			req.Cols = uint32(c)
		}
		if rw, ok := s["rows"].(float64); ok {
			req.Rows = uint32(rw)
		}
	}
	it, err := r.client.ExecInteractive(ctx, req)
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var output, stdout bytes.Buffer
	var exitCode any
	take := func(ev *openshell.ExecEvent) {
		if ev.Exited {
			exitCode = ev.ExitCode
			return
		}
		output.Write(ev.Stdout)
		output.Write(ev.Stderr)
		stdout.Write(ev.Stdout)
	}
	actions, _ := s["actions"].([]any)
	for _, a := range actions {
		action, _ := a.(map[string]any)
		switch {
		case action["wait_output"] != nil:
			wanted := fmt.Sprint(action["wait_output"])
			for !bytes.Contains(output.Bytes(), []byte(wanted)) {
				ev, err := it.Recv()
				if err == io.EOF || (err == nil && ev.Exited) {
					return nil, fail("the process ended before '%s'", wanted)
				}
				if err != nil {
					return nil, err
				}
				take(ev)
			}
		case action["resize"] != nil:
			size, _ := action["resize"].([]any)
			if len(size) == 2 {
				if err := it.Resize(uint32(number(size[0])), uint32(number(size[1]))); err != nil {
					return nil, err
				}
			}
		case action["write"] != nil:
			if _, err := it.Write([]byte(fmt.Sprint(action["write"]))); err != nil {
				return nil, err
			}
		case action["close_stdin"] == true:
			if err := it.CloseStdin(); err != nil {
				return nil, err
			}
		}
	}
	for {
		ev, err := it.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		take(ev)
	}
	res := result{"exit_code": exitCode}
	text(res, "stdout", stdout.Bytes())
	text(res, "output", output.Bytes())
	return res, nil
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func main() {
	args := os.Args[1:]
	only := map[string]bool{}
	if at := slices.Index(args, "--only"); at >= 0 {
		for _, id := range args[at+1:] {
			only[id] = true
		}
		args = args[:at]
	}
	file := "conformance/scenarios.json"
	if len(args) > 0 {
		file = args[0]
	}
	endpoint := os.Getenv("OPENSHELL_ENDPOINT")
	if endpoint == "" {
		endpoint = openshell.DefaultEndpoint
	}
	runID := os.Getenv("OPENSHELL_CONFORMANCE_RUN")
	if runID == "" {
		runID = randomID()
	}
	runID = strings.Map(func(c rune) rune {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			return c
		}
		return -1
	}, strings.ToLower(runID))
	if len(runID) > 12 {
		runID = runID[:12]
	}
	client, err := openshell.Dial(context.Background(), endpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance (go):", err)
		os.Exit(1)
	}
	r := &runner{
		endpoint: endpoint, dataDir: os.Getenv("OPENSHELL_CONFORMANCE_DATA_DIR"),
		runID: runID, prefix: "cf-go-" + runID + "-", client: client,
		named: map[string]bool{}, ready: map[string]bool{},
		control: os.Getenv("OPENSHELL_CONFORMANCE_CONTROL"),
		caps:    []string{"routing_stats"},
	}
	if r.dataDir != "" {
		r.caps = append(r.caps, "push_config")
	}
	if r.control != "" {
		r.caps = append(r.caps, "replica_control")
	}
	emit(map[string]any{"type": "hello", "runner": "go", "run": r.runID, "sandbox_prefix": r.prefix, "capabilities": r.caps})
	defer r.cleanup()
	raw, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance (go):", err)
		return
	}
	var doc struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		fmt.Fprintln(os.Stderr, "conformance (go):", err)
		return
	}
	for _, sc := range doc.Scenarios {
		if len(only) == 0 || only[sc.ID] {
			r.run(sc)
		}
	}
}
