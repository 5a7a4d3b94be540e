// Command bench is the Go program of `make bench BENCH=languages` (and
// `make bench BENCH=go`): the Go SDK (the Rust core through cgo) against a
// plain grpc-go client of the same proto (protoc-gen-go messages, calls
// through grpc.ClientConn the way generated stubs make them, and a
// ForwardTcp pump as a grpc-go user would write it), following the
// per-language contract of bench/src/contract.rs.
//
// Inputs (environment): OPENSHELL_ENDPOINT, OPENSHELL_TOKEN (optional),
// OPENSHELL_BENCH_SANDBOX (READY), OPENSHELL_BENCH_IPERF_PORT (an
// `iperf3 -s` on 127.0.0.1 that the sandbox reaches: its own loopback under
// namespace isolation), OPENSHELL_BENCH_ROUNDS
// (default 5), OPENSHELL_BENCH_FORWARD_SECONDS (default 3),
// OPENSHELL_BENCH_EXEC_MIB (default 64). Without OPENSHELL_ENDPOINT it
// starts `openshell-gateway serve --dev` from $OPENSHELL_BIN_DIR, a sandbox
// and (when iperf3 is on PATH) its own `iperf3 -s` inside that sandbox, and
// stops them (the gateway by PID, iperf3 with its exec stream).
//
// Per round, each figure runs the clients in a fresh random order:
// GetSandbox latency (100 batches of 10 per client, interleaved; the
// curated Sandboxes().Get, the raw stub Raw().GetSandbox and grpc-go), 100
// concurrent callers x 20 calls on one client, one iperf3 run through each
// forward, one exec of `head -c` streaming its stdout. Prints a table, then
// as the last line `BENCH_JSON {...}` with the medians over the rounds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

const (
	getSandbox  = "/openshell.v1.OpenShell/GetSandbox"
	execSandbox = "/openshell.v1.OpenShell/ExecSandbox"
	forwardTCP  = "/openshell.v1.OpenShell/ForwardTcp"
	frameSize   = 64 * 1024 // the core's frame size

	unaryWarmup   = 100
	unaryBatches  = 100
	unaryBatch    = 10
	callers       = 100
	callsPerAgent = 20
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func envInt(name string, fallback int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return fallback, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s is not a positive number", name)
	}
	return n, nil
}

// ---------------------------------------------------------------- standalone

func startGateway() (string, func(), error) {
	dir := os.Getenv("OPENSHELL_BIN_DIR")
	if dir == "" {
		return "", nil, errors.New("set OPENSHELL_ENDPOINT, or OPENSHELL_BIN_DIR to the release binaries")
	}
	tmp, err := os.MkdirTemp("", "openshell-go-bench-")
	if err != nil {
		return "", nil, err
	}
	ready := filepath.Join(tmp, "ready.json")
	cmd := exec.Command(filepath.Join(dir, "openshell-gateway"), "serve", "--listen", "127.0.0.1:0",
		"--metrics-listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "data"), "--ready-file", ready,
		"--stop-sandboxes-on-exit", "--dev")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = os.RemoveAll(tmp)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var info struct {
			URL string `json:"url"`
		}
		if b, err := os.ReadFile(ready); err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			return strings.TrimSuffix(info.URL, "/"), stop, nil
		}
		select {
		case <-done:
			return "", nil, errors.New("the gateway exited before it was ready")
		default:
		}
	}
	stop()
	return "", nil, errors.New("the gateway did not start in 60 s")
}

// iperf3Server runs `iperf3 -s` inside sandbox (on its own loopback: a
// forward's target is the sandbox's port) until stop. The port is one free
// on this host, so that it is free in the sandbox without isolation too.
func iperf3Server(ctx context.Context, client *openshell.Client, sandbox string) (int, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	ctx, cancel := context.WithCancel(ctx)
	st, err := client.ExecStream(ctx, openshell.ExecRequest{Sandbox: sandbox,
		Command: []string{"iperf3", "-s", "--forceflush", "-B", "127.0.0.1", "-p", fmt.Sprint(port)}})
	if err != nil {
		cancel()
		return 0, nil, err
	}
	stop := func() { cancel(); st.Close() }
	late := time.AfterFunc(10*time.Second, cancel) // ends a Recv that waits too long
	defer late.Stop()
	var output strings.Builder
	for !strings.Contains(output.String(), "Server listening") {
		ev, err := st.Recv()
		switch {
		case err != nil && !late.Stop():
			stop()
			return 0, nil, errors.New("iperf3 -s did not listen within 10 s")
		case err != nil:
			stop()
			return 0, nil, err
		case ev.Exited:
			stop()
			return 0, nil, fmt.Errorf("iperf3 -s exited with %d before it listened: %s", ev.ExitCode, output.String())
		}
		output.Write(ev.Stdout)
		output.Write(ev.Stderr)
	}
	// Drain the rest (iperf3 prints per test) so the server never blocks on a full pipe.
	go func() {
		for _, err := range st.All() {
			if err != nil {
				return
			}
		}
	}()
	return port, stop, nil
}

// iperf3GbitS is one `iperf3 -c` run (one stream) into port: the
// receiver's Gbit/s.
func iperf3GbitS(port, seconds int) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+60)*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, "iperf3", "-c", "127.0.0.1", "-p", fmt.Sprint(port), "-t", fmt.Sprint(seconds), "-J").Output()
	var report struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if jerr := json.Unmarshal(b, &report); jerr != nil || report.Error != "" || err != nil {
		return 0, fmt.Errorf("iperf3 -c to port %d: %v %v %s", port, err, jerr, report.Error)
	}
	return report.End.SumReceived.BitsPerSecond / 1e9, nil
}

// ---------------------------------------------------------------- grpc-go

// grpcForward is grpc-go's forward: a local listener whose connections are
// each pumped over one ForwardTcp stream, the way the core pumps them
// (local EOF half-closes the stream, the gateway's eof frame half-closes
// the connection, the stream's end ends it).
func grpcForward(ctx context.Context, conn *grpc.ClientConn, sandbox string, port int) (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go grpcPump(ctx, conn, c.(*net.TCPConn), sandbox, port)
		}
	}()
	return l, nil
}

func grpcPump(ctx context.Context, conn *grpc.ClientConn, local *net.TCPConn, sandbox string, port int) {
	defer local.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: "ForwardTcp", ClientStreams: true, ServerStreams: true}
	st, err := conn.NewStream(ctx, desc, forwardTCP)
	if err != nil {
		return
	}
	init := &openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: &openshellv1.TcpForwardInit{
		Sandbox: sandbox, Target: &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: uint32(port)}},
	}}}
	if err := st.SendMsg(init); err != nil {
		return
	}
	go func() {
		for {
			// A fresh buffer per frame: grpc-go may keep a sent message.
			buf := make([]byte, frameSize)
			n, err := local.Read(buf)
			if n > 0 {
				if st.SendMsg(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: buf[:n]}}) != nil {
					cancel()
					return
				}
			}
			if err == io.EOF {
				_ = st.CloseSend()
				return
			}
			if err != nil {
				cancel()
				return
			}
		}
	}()
	for {
		in := new(openshellv1.TcpForwardFrame)
		if err := st.RecvMsg(in); err != nil {
			return
		}
		switch {
		case len(in.GetData()) > 0:
			if _, err := local.Write(in.GetData()); err != nil {
				return
			}
		case in.GetEof() != nil:
			_ = local.CloseWrite()
		}
	}
}

// ---------------------------------------------------------------- arms

type arm struct {
	name    string
	get     func() error
	exec    func(bytes int) (int, error) // stdout bytes of head -c; nil: not measured
	port    int                          // forward listener; 0: not measured
	p50     []float64
	p99     []float64
	conc    []float64
	forward []float64
	execMiB []float64
}

func headCommand(bytes int) []string {
	return []string{"head", "-c", strconv.Itoa(bytes), "/dev/zero"}
}

func percentileUs(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*p+0.5)].Nanoseconds()) / 1e3
}

func median(v []float64) any {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// shuffled is 0..n in a random order.
func shuffled(n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	rand.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	return order
}

// concurrent runs callers x each calls of get: calls per second.
func concurrent(get func() error, callers, each int) (float64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := get(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(callers*each) / time.Since(start).Seconds(), nil
}

func run() error {
	rounds, err := envInt("OPENSHELL_BENCH_ROUNDS", 5)
	if err != nil {
		return err
	}
	seconds, err := envInt("OPENSHELL_BENCH_FORWARD_SECONDS", 3)
	if err != nil {
		return err
	}
	execMiB, err := envInt("OPENSHELL_BENCH_EXEC_MIB", 64)
	if err != nil {
		return err
	}
	iperfPort, err := envInt("OPENSHELL_BENCH_IPERF_PORT", 0)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	endpoint := os.Getenv("OPENSHELL_ENDPOINT")
	token := os.Getenv("OPENSHELL_TOKEN")
	sandbox := os.Getenv("OPENSHELL_BENCH_SANDBOX")
	var opts []openshell.Option
	if token != "" {
		opts = append(opts, openshell.WithToken(token))
	}
	if endpoint == "" {
		url, stop, err := startGateway()
		if err != nil {
			return err
		}
		defer stop()
		endpoint = url
	}
	client, err := openshell.Dial(ctx, endpoint, opts...)
	if err != nil {
		return err
	}
	defer client.Close()
	if sandbox == "" {
		sb, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: "go-bench"})
		if err != nil {
			return err
		}
		defer client.Sandboxes().Delete(context.Background(), sb.Name)
		if _, err := client.Sandboxes().WaitReady(ctx, sb.Name); err != nil {
			return err
		}
		sandbox = sb.Name
	}
	if iperfPort == 0 {
		if _, err := exec.LookPath("iperf3"); err == nil {
			port, stop, err := iperf3Server(ctx, client, sandbox)
			if err != nil {
				return err
			}
			defer stop()
			iperfPort = port
		}
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(endpoint, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	gctx := ctx
	if token != "" {
		gctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}

	sdk := &arm{name: "sdk",
		get: func() error { _, err := client.Sandboxes().Get(ctx, sandbox); return err },
		exec: func(bytes int) (int, error) {
			st, err := client.ExecStream(ctx, openshell.ExecRequest{Sandbox: sandbox, Command: headCommand(bytes)})
			if err != nil {
				return 0, err
			}
			defer st.Close()
			total := 0
			for ev, err := range st.All() {
				if err != nil {
					return total, err
				}
				total += len(ev.Stdout)
				if ev.Exited && ev.ExitCode != 0 {
					return total, fmt.Errorf("head exited with %d", ev.ExitCode)
				}
			}
			return total, nil
		},
	}
	raw := &arm{name: "sdk-raw", get: func() error {
		_, err := client.Raw().GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: sandbox})
		return err
	}}
	native := &arm{name: "grpc-go",
		get: func() error {
			resp := new(openshellv1.SandboxResponse)
			return conn.Invoke(gctx, getSandbox, &openshellv1.GetSandboxRequest{Name: sandbox}, resp)
		},
		exec: func(bytes int) (int, error) {
			desc := &grpc.StreamDesc{StreamName: "ExecSandbox", ServerStreams: true}
			sctx, done := context.WithCancel(gctx)
			defer done()
			st, err := conn.NewStream(sctx, desc, execSandbox)
			if err != nil {
				return 0, err
			}
			if err := st.SendMsg(&openshellv1.ExecSandboxRequest{Sandbox: sandbox, Command: headCommand(bytes)}); err != nil {
				return 0, err
			}
			if err := st.CloseSend(); err != nil {
				return 0, err
			}
			total, exit := 0, int32(-1)
			for {
				ev := new(openshellv1.ExecSandboxEvent)
				err := st.RecvMsg(ev)
				if err == io.EOF {
					break
				}
				if err != nil {
					return total, err
				}
				total += len(ev.GetStdout().GetData())
				if e := ev.GetExit(); e != nil {
					exit = e.GetExitCode()
				}
			}
			if exit != 0 {
				return total, fmt.Errorf("exec ended with exit %d", exit)
			}
			return total, nil
		},
	}
	arms := []*arm{sdk, raw, native}

	if iperfPort > 0 {
		fwd, err := client.Forward(ctx, sandbox, iperfPort)
		if err != nil {
			return err
		}
		defer fwd.Close()
		pump, err := grpcForward(gctx, conn, sandbox, iperfPort)
		if err != nil {
			return err
		}
		defer pump.Close()
		_, p, _ := net.SplitHostPort(fwd.Addr())
		sdk.port, _ = strconv.Atoi(p)
		native.port = pump.Addr().(*net.TCPAddr).Port
	}

	for _, a := range arms { // warm-up: connections, owner cache
		for range unaryWarmup {
			if err := a.get(); err != nil {
				return fmt.Errorf("%s: %w", a.name, err)
			}
		}
		if _, err := concurrent(a.get, callers, 1); err != nil {
			return fmt.Errorf("%s: %w", a.name, err)
		}
	}
	execBytes := execMiB << 20
	for round := range rounds {
		lat := make([][]time.Duration, len(arms))
		for range unaryBatches {
			for _, i := range shuffled(len(arms)) {
				for range unaryBatch {
					t := time.Now()
					if err := arms[i].get(); err != nil {
						return fmt.Errorf("%s: %w", arms[i].name, err)
					}
					lat[i] = append(lat[i], time.Since(t))
				}
			}
		}
		for i, a := range arms {
			a.p50 = append(a.p50, percentileUs(lat[i], 0.5))
			a.p99 = append(a.p99, percentileUs(lat[i], 0.99))
		}
		for _, i := range shuffled(len(arms)) {
			rate, err := concurrent(arms[i].get, callers, callsPerAgent)
			if err != nil {
				return fmt.Errorf("%s: %w", arms[i].name, err)
			}
			arms[i].conc = append(arms[i].conc, rate)
		}
		for _, i := range shuffled(len(arms)) {
			if arms[i].port == 0 {
				continue
			}
			gbit, err := iperf3GbitS(arms[i].port, seconds)
			if err != nil {
				return fmt.Errorf("%s forward: %w", arms[i].name, err)
			}
			arms[i].forward = append(arms[i].forward, gbit)
		}
		for _, i := range shuffled(len(arms)) {
			if arms[i].exec == nil {
				continue
			}
			t := time.Now()
			got, err := arms[i].exec(execBytes)
			if err != nil {
				return fmt.Errorf("%s exec: %w", arms[i].name, err)
			}
			if got != execBytes {
				return fmt.Errorf("%s exec: %d of %d bytes", arms[i].name, got, execBytes)
			}
			arms[i].execMiB = append(arms[i].execMiB, float64(execMiB)/time.Since(t).Seconds())
		}
		fmt.Fprintf(os.Stderr, "go: round %d of %d done\n", round+1, rounds)
	}

	fmt.Printf("go: Go SDK vs grpc-go, %d rounds (medians); per round %d GetSandbox calls per client, %d concurrent callers x %d, one iperf3 -t %d per forward, one exec of %d MiB stdout\n",
		rounds, unaryBatches*unaryBatch, callers, callsPerAgent, seconds, execMiB)
	fmt.Printf("  %-8s %10s %10s %12s %12s %12s\n", "client", "p50 us", "p99 us", "conc/s", "fwd Gbit/s", "exec MiB/s")
	cell := func(v any, digits int) string {
		if f, ok := v.(float64); ok {
			return strconv.FormatFloat(f, 'f', digits, 64)
		}
		return "-"
	}
	rows := make([]map[string]any, 0, len(arms))
	for _, a := range arms {
		row := map[string]any{
			"client":            a.name,
			"unary_p50_us":      median(a.p50),
			"unary_p99_us":      median(a.p99),
			"concurrent_per_s":  median(a.conc),
			"forward_gbit_s":    median(a.forward),
			"exec_stdout_mib_s": median(a.execMiB),
		}
		rows = append(rows, row)
		fmt.Printf("  %-8s %10s %10s %12s %12s %12s\n", a.name, cell(row["unary_p50_us"], 1), cell(row["unary_p99_us"], 1),
			cell(row["concurrent_per_s"], 0), cell(row["forward_gbit_s"], 2), cell(row["exec_stdout_mib_s"], 0))
	}
	line, err := json.Marshal(map[string]any{"language": "go", "rows": rows})
	if err != nil {
		return err
	}
	fmt.Printf("BENCH_JSON %s\n", line)
	return nil
}
