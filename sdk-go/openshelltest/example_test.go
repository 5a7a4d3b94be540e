package openshelltest_test

import (
	"context"
	"fmt"
	"log"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/openshelltest"
)

// A cluster outside a test (in a TestMain shared by a package's tests, or a
// program): New, then Stop. In a test, openshelltest.Start(t) does both.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := openshelltest.New(ctx, openshelltest.WithReplicas(1))
	if err != nil {
		log.Fatal(err) // an *openshell.Error matching openshell.ErrCluster names its logs
	}
	defer cluster.Stop(context.Background())

	client, err := cluster.Dial(ctx) // closed by Stop
	if err != nil {
		log.Fatal(err)
	}
	sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
		log.Fatal(err)
	}
	out, err := client.Exec(ctx, openshell.ExecRequest{Sandbox: sandbox.Name, Command: []string{"echo", "hello"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out.Stdout))
	// Output: hello
}
