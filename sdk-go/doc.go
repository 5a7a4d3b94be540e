// Package openshell is the Go SDK of OpenShell: sandboxes, exec, port
// forwards and every RPC of the gateway, over the same Rust core client the
// Rust, Python and TypeScript SDKs use (linked through cgo and the C ABI in
// bindings/c, so cgo is required).
//
// Every call takes a context.Context first: cancelling it cancels the call
// in the core (for exec, the gateway kills the process), and its deadline
// becomes the call's deadline. Errors are *Error values that work with
// errors.Is (ErrNotFound, ErrInvalidArgument, context.Canceled, ...) and
// errors.As (code, gRPC status, the replica that served the call).
//
//	client, err := openshell.Dial(ctx, "http://127.0.0.1:17670")
//	if err != nil { ... }
//	defer client.Close()
//	sb, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{Image: "alpine:3"})
//
// A Client is safe for concurrent use by many goroutines; share one. Close
// releases it; a cleanup releases a client that was dropped without Close.
package openshell
