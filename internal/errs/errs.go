// Package errs defines the small set of error kinds berth uses everywhere.
// Errors are wrapped with %w and context; each protocol (REST, E2B control
// plane, Connect) translates a Kind to its status in exactly one place.
package errs

import (
	"errors"
	"fmt"
)

// Kind classifies an error for callers and protocols.
type Kind int

const (
	Internal Kind = iota
	NotFound
	AlreadyExists
	InvalidArgument
	FailedPrecondition
	Conflict
	ResourceExhausted
	PermissionDenied
	Unauthenticated
	Unavailable
	NotImplemented
)

var kindNames = map[Kind]string{
	Internal:           "internal",
	NotFound:           "not_found",
	AlreadyExists:      "already_exists",
	InvalidArgument:    "invalid_argument",
	FailedPrecondition: "failed_precondition",
	Conflict:           "conflict",
	ResourceExhausted:  "resource_exhausted",
	PermissionDenied:   "permission_denied",
	Unauthenticated:    "unauthenticated",
	Unavailable:        "unavailable",
	NotImplemented:     "not_implemented",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return "internal"
}

// Kinds lists every kind, for table tests of protocol mappings.
func Kinds() []Kind {
	return []Kind{Internal, NotFound, AlreadyExists, InvalidArgument, FailedPrecondition,
		Conflict, ResourceExhausted, PermissionDenied, Unauthenticated, Unavailable, NotImplemented}
}

// Error is a classified error. Field names the offending input field, if any.
type Error struct {
	Kind    Kind
	Field   string
	Message string
	Err     error
}

func (e *Error) Error() string {
	msg := e.Message
	if e.Field != "" && msg == "" {
		msg = "invalid " + e.Field
	}
	if e.Err != nil {
		if msg == "" {
			return e.Err.Error()
		}
		return msg + ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// E builds a classified error with a formatted message.
func E(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// Field builds an InvalidArgument error that names the bad input field.
func Field(field, format string, args ...any) error {
	return &Error{Kind: InvalidArgument, Field: field, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// Wrap classifies err with a kind and context message.
func Wrap(k Kind, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...), Err: err}
}

// KindOf returns the kind of the first classified error in err's chain, or Internal.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// FieldOf returns the field named by the first classified error in err's chain.
func FieldOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		if e.Field != "" {
			return e.Field
		}
		return FieldOf(e.Err)
	}
	return ""
}

// Is reports whether err is of kind k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }
