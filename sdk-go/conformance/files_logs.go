package main

// The files, logs and watch ops of scenarios.json.

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

const (
	logsWait  = 15 * time.Second
	watchWait = 20 * time.Second
	// Quiet time after the first event before watch_logs runs its command.
	settle = time.Second
	// How long watch_logs waits for that quiet at most.
	settleLimit = 60 * time.Second
)

func init() {
	ops["write_file"] = writeFileOp
	ops["read_file"] = readFileOp
	ops["file_round_trip"] = fileRoundTripOp
	ops["logs"] = logsOp
	ops["watch_logs"] = watchLogsOp
	ops["watch_events"] = watchEventsOp
}

func substStr(r *runner, v any) string {
	s, _ := r.subst(v).(string)
	return s
}

func writeFileOp(ctx context.Context, r *runner, s step) (result, error) {
	content := substStr(r, s["content"])
	summary, err := r.client.WriteFile(ctx, r.target(s), substStr(r, s["path"]), []byte(content))
	if err != nil {
		return nil, err
	}
	return result{"bytes": summary.Bytes}, nil
}

func readFileOp(ctx context.Context, r *runner, s step) (result, error) {
	data, err := r.client.ReadFile(ctx, r.target(s), substStr(r, s["path"]))
	if err != nil {
		return nil, err
	}
	res := result{}
	text(res, "content", data)
	return res, nil
}

// fileRoundTripOp writes random bytes to a local file, uploads it by path,
// downloads it by path to another and compares.
func fileRoundTripOp(ctx context.Context, r *runner, s step) (result, error) {
	name, remote := r.target(s), substStr(r, s["remote"])
	data := make([]byte, number(s["size"]))
	if _, err := rand.Read(data); err != nil {
		return nil, fail("random bytes: %v", err)
	}
	dir, err := os.MkdirTemp("", "conformance-files-")
	if err != nil {
		return nil, fail("temp dir: %v", err)
	}
	defer os.RemoveAll(dir)
	sent, back := filepath.Join(dir, "sent.bin"), filepath.Join(dir, "back.bin")
	if err := os.WriteFile(sent, data, 0o600); err != nil {
		return nil, fail("write %s: %v", sent, err)
	}
	summary, err := r.client.Upload(ctx, name, sent, remote)
	if err != nil {
		return nil, err
	}
	if _, err := r.client.Download(ctx, name, remote, back); err != nil {
		return nil, err
	}
	got, err := os.ReadFile(back)
	if err != nil {
		return nil, fail("read %s: %v", back, err)
	}
	return result{"bytes": summary.Bytes, "same": bytes.Equal(got, data)}, nil
}

func logsOp(ctx context.Context, r *runner, s step) (result, error) {
	q := openshell.LogQuery{Tail: number(s["tail"])}
	if src, ok := s["source"].(string); ok {
		q.Sources = []string{src}
	}
	q.MinLevel, _ = s["min_level"].(string)
	waitFor, waiting := s["wait_for"].(string)
	deadline := time.Now().Add(logsWait)
	for {
		logs, err := r.client.Sandboxes().Logs(ctx, r.target(s), q)
		if err != nil {
			return nil, err
		}
		messages := make([]string, 0, len(logs.Lines))
		sources := make([]string, 0, len(logs.Lines))
		for _, l := range logs.Lines {
			messages = append(messages, l.Message)
			sources = append(sources, l.Source)
		}
		if !waiting || slices.Contains(messages, waitFor) || time.Now().After(deadline) {
			return result{"messages": messages, "sources": sources}, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// watchLogsOp follows the sandbox's supervisor lines, lets earlier steps'
// lines arrive, runs the command and reads until its own exec line.
func watchLogsOp(ctx context.Context, r *runner, s step) (result, error) {
	name, command := r.target(s), strs(r.subst(s["command"]))
	w, err := r.client.Sandboxes().Events(ctx, name, openshell.WatchOptions{
		NoStatus: true, Logs: &openshell.LogQuery{Sources: []string{"sandbox"}},
	})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	next := func(limit time.Duration) (openshell.Event, error) {
		c, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		return w.Next(c)
	}
	first, err := next(watchWait)
	if err != nil {
		return nil, err
	}
	last, ordered := first.Cursor, true
	settleBy := time.Now().Add(settleLimit)
	for {
		if time.Now().After(settleBy) {
			return nil, fail("the watch did not go quiet for %s within %s", settle, settleLimit)
		}
		ev, err := next(settle)
		if err != nil {
			break
		}
		ordered = ordered && ev.Cursor >= last
		last = ev.Cursor
	}
	// The settle wait closed the watch (its context ended): a new one
	// resumes exactly after the last event seen.
	w.Close()
	opened := last
	w, err = r.client.Sandboxes().Events(ctx, name, openshell.WatchOptions{
		NoStatus: true, Logs: &openshell.LogQuery{Sources: []string{"sandbox"}}, ResumeAfter: opened,
	})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	if _, err := r.client.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: command}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(watchWait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fail("no exec line within %s", watchWait)
		}
		ev, err := next(left)
		if err != nil {
			return nil, err
		}
		ordered = ordered && ev.Cursor >= last
		last = ev.Cursor
		if ev.Log != nil && ev.Log.Message == "exec finished" && len(command) > 0 &&
			ev.Log.Fields["argv0"] == command[0] && ev.Cursor > opened {
			code, err := strconv.Atoi(ev.Log.Fields["exit_code"])
			if err != nil {
				return nil, fail("an exec line without exit_code: %v", ev.Log.Fields)
			}
			return result{"finished_exit_code": code, "cursors_ordered": ordered}, nil
		}
	}
}

func watchEventsOp(ctx context.Context, r *runner, s step) (result, error) {
	w, err := r.client.Sandboxes().Events(ctx, r.target(s), openshell.WatchOptions{
		ResumeAfter: fmt.Sprint(s["resume_after"]),
	})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	c, cancel := context.WithTimeout(ctx, watchWait)
	defer cancel()
	ev, err := w.Next(c)
	if err != nil {
		return nil, err
	}
	if ev.Log != nil {
		return result{"first": "log"}, nil
	}
	return result{"first": "sandbox"}, nil
}
