package openshell_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// Create a sandbox, run a command in it, delete it. The client dials
// OPENSHELL_ENDPOINT (`make up`'s cluster by default).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := openshell.DialFromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{Image: "alpine:3"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Sandboxes().Delete(context.Background(), sandbox.Name)
	if _, err := client.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
		log.Fatal(err)
	}

	out, err := client.Exec(ctx, openshell.ExecRequest{Sandbox: sandbox.Name, Command: []string{"echo", "hello"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", out.Stdout)
	// Output: hello
}

// Stream a command's output as it is produced, ranging over the events.
func ExampleClient_ExecStream() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := openshell.DialFromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Sandboxes().Delete(context.Background(), sandbox.Name)
	if _, err := client.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
		log.Fatal(err)
	}

	stream, err := client.ExecStream(ctx, openshell.ExecRequest{
		Sandbox: sandbox.Name,
		Command: []string{"sh", "-c", "echo one; echo two; exit 3"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Close()
	for event, err := range stream.All() {
		if err != nil {
			log.Fatal(err)
		}
		if event.Exited {
			fmt.Println("exit", event.ExitCode)
		} else {
			fmt.Printf("%s", event.Stdout)
		}
	}
	// Output:
	// one
	// two
	// exit 3
}

// A missing sandbox is ErrNotFound; errors.As gives the details.
func ExampleError() {
	ctx := context.Background()
	client, err := openshell.DialFromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, err = client.Sandboxes().Get(ctx, "no-such-sandbox")
	var e *openshell.Error
	fmt.Println(errors.Is(err, openshell.ErrNotFound), errors.As(err, &e) && e.GRPCStatus == 5)
	// Output: true true
}
