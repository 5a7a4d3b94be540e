package openshell

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"example.invalid/openshell/sdk-go/internal/native"
)

// Sentinel errors for errors.Is. An *Error matches the sentinel of its code.
var (
	ErrNotFound           = errors.New("openshell: not found")
	ErrAlreadyExists      = errors.New("openshell: already exists")
	ErrInvalidArgument    = errors.New("openshell: invalid argument")
	ErrFailedPrecondition = errors.New("openshell: failed precondition")
	ErrPermissionDenied   = errors.New("openshell: permission denied")
	ErrUnauthenticated    = errors.New("openshell: unauthenticated")
	ErrUnavailable        = errors.New("openshell: unavailable")
	ErrResourceExhausted  = errors.New("openshell: resource exhausted")
	ErrUnimplemented      = errors.New("openshell: unimplemented")
	ErrInternal           = errors.New("openshell: internal error")
	ErrInvalidConfig      = errors.New("openshell: invalid configuration")
	ErrOutputLimit        = errors.New("openshell: output limit exceeded")
	ErrStreamClosed       = errors.New("openshell: stream closed")
	// ErrOutOfRange matches a resumed watch whose cursor the gateway no
	// longer holds the events after (it keeps a bounded number): start a
	// new watch without ResumeAfter, from the current state.
	ErrOutOfRange = errors.New("openshell: out of range")
	// ErrCluster matches a failure of a local test cluster (package
	// openshelltest): it did not start, an order failed, or it did not stop
	// cleanly. Error.Logs names the directory of its kept logs.
	ErrCluster = errors.New("openshell: local cluster failed")
	// ErrClosed matches a call on a closed Client (or a stream or session
	// closed before or during the call), and a call that Close cancelled
	// while it ran (such an error matches context.Canceled too).
	ErrClosed = errors.New("openshell: client closed")
)

var sentinels = map[string]error{
	"not_found":           ErrNotFound,
	"already_exists":      ErrAlreadyExists,
	"invalid_argument":    ErrInvalidArgument,
	"failed_precondition": ErrFailedPrecondition,
	"permission_denied":   ErrPermissionDenied,
	"unauthenticated":     ErrUnauthenticated,
	"auth":                ErrUnauthenticated,
	"unavailable":         ErrUnavailable,
	"connect":             ErrUnavailable,
	"resource_exhausted":  ErrResourceExhausted,
	"unimplemented":       ErrUnimplemented,
	"internal":            ErrInternal,
	"panic":               ErrInternal,
	"invalid_config":      ErrInvalidConfig,
	"output_limit":        ErrOutputLimit,
	"stream_closed":       ErrStreamClosed,
	"out_of_range":        ErrOutOfRange,
	"cluster":             ErrCluster,
}

// GRPCCode is a gRPC status code (the numbering of google.golang.org/grpc/codes).
type GRPCCode uint32

// Error is every failure of the SDK.
type Error struct {
	// Code is the core's stable string code: "not_found", "invalid_argument",
	// "unavailable", "connect", "invalid_config", "cancelled",
	// "deadline_exceeded", "output_limit", "auth", "cluster", ...
	Code string
	// GRPCStatus is the gateway's status, or the nearest one for a local failure.
	GRPCStatus GRPCCode
	// Message is human-readable and never holds a token or environment value.
	Message string
	// Retryable tells whether the same call may succeed later.
	Retryable bool
	// ServedBy names the replica that produced the error, when known.
	ServedBy string
	// Logs is the directory of a local cluster's logs, kept for reading
	// (code "cluster"; empty when nothing was kept).
	Logs string
	// closed marks a call on a closed client or handle, or one that a
	// Close cancelled while it ran.
	closed bool
}

func (e *Error) Error() string {
	msg := e.Message
	if e.Logs != "" && !strings.Contains(msg, e.Logs) {
		msg += "; logs in " + e.Logs
	}
	if e.ServedBy != "" {
		return fmt.Sprintf("openshell: %s: %s (served by %s)", e.Code, msg, e.ServedBy)
	}
	return fmt.Sprintf("openshell: %s: %s", e.Code, msg)
}

// Is matches the sentinel of the error's code, context.Canceled for a
// cancelled call and context.DeadlineExceeded for an expired deadline.
func (e *Error) Is(target error) bool {
	switch target {
	case context.Canceled:
		return e.Code == "cancelled"
	case context.DeadlineExceeded:
		return e.Code == "deadline_exceeded"
	case ErrClosed:
		return e.closed
	}
	s, ok := sentinels[e.Code]
	return ok && s == target
}

// GRPCCode returns the gRPC status code.
func (e *Error) GRPCCode() GRPCCode { return e.GRPCStatus }

func fromNative(e *native.Error) *Error {
	return &Error{
		Code:       e.Code,
		GRPCStatus: GRPCCode(e.GRPCStatus),
		Message:    e.Message,
		Retryable:  e.Retryable,
		ServedBy:   e.ServedBy,
		Logs:       e.Logs,
		closed:     e.Closed,
	}
}

func invalid(format string, args ...any) *Error {
	return &Error{Code: "invalid_config", GRPCStatus: 3, Message: fmt.Sprintf(format, args...)}
}

// alreadyRunning refuses a second concurrent Run of a session, with the
// code and status the C ABI gives the same refusal.
func alreadyRunning(what string) *Error {
	return &Error{Code: "failed_precondition", GRPCStatus: 9,
		Message: "the " + what + " is already running: one run at a time (the running one goes on)"}
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
