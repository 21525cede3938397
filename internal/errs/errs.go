// Package errs defines the small set of error kinds berth uses everywhere.
// Errors are wrapped with %w and context; each protocol (REST, E2B control
// plane, Connect) translates a Kind to its status in exactly one place
// (internal/httpx).
//
// # Which kind an error has
//
// The innermost meaningful kind wins. Wrapping adds context, not a verdict:
// Wrap(Internal, err, ...) or Wrap(Unavailable, err, ...) around an error that
// already has a kind keeps that kind, so a full disk deep in rootfs
// (ResourceExhausted) still answers as ResourceExhausted after every layer
// above it wrapped it for context. The kind given to Wrap applies only when
// nothing inside err is classified (a raw os or library error). Internal is
// never meaningful on its own when something more precise is inside.
//
// A layer that deliberately changes the verdict says so with Reclassify:
// e.g. a template that is NotFound while creating a sandbox must answer
// FailedPrecondition (or InvalidArgument naming the field), never NotFound,
// which would read as "the sandbox is not found". A reclassified error is a
// barrier: KindOf stops there, and FieldOf does not look beneath it (the
// reclassifying layer names its own field, if any).
//
// Hide(err, k, kinds...) is the selective form: it reclassifies only the
// listed kinds (typically NotFound) and lets every other kind through.
//
// Fields named by Field (or an Error's Field) survive every Wrap: FieldOf
// returns the outermost field above the first barrier.
package errs

import (
	"fmt"
	"strings"
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

// KindNamed is the inverse of Kind.String, for protocols whose error bodies
// name the kind (REST's reason, the agent's code); an unknown name is false.
func KindNamed(name string) (Kind, bool) {
	for k, n := range kindNames {
		if n == name {
			return k, true
		}
	}
	return Internal, false
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
	// Reclassified makes Kind (and Field) final: kinds and fields of the
	// errors inside Err are not consulted. Set by Reclassify.
	Reclassified bool
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

// Wrap adds context to err. Its kind k applies only if nothing inside err
// is classified already: the innermost meaningful kind wins (see the package
// doc). Use Reclassify to override an inner kind on purpose.
func Wrap(k Kind, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...), Err: err}
}

// Reclassify wraps err with kind k that replaces whatever kind err carries:
// the layer calling it decides the verdict (e.g. an inner NotFound that must
// not read as the outer object's NotFound). err stays in the chain for
// errors.Is/As and the message.
func Reclassify(k Kind, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...), Err: err, Reclassified: true}
}

// ReclassifyField is Reclassify to InvalidArgument naming the bad input field.
func ReclassifyField(field string, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: InvalidArgument, Field: field, Message: field + ": " + fmt.Sprintf(format, args...),
		Err: err, Reclassified: true}
}

// Hide reclassifies err as k when its kind is one of kinds, and returns it
// unchanged otherwise: an inner object's NotFound (a layer, a container)
// must not read as the outer object's NotFound (the sandbox the request
// names), while a ResourceExhausted underneath still answers as one.
func Hide(err error, k Kind, kinds ...Kind) error {
	if err == nil {
		return nil
	}
	got := KindOf(err)
	for _, h := range kinds {
		if got == h {
			return &Error{Kind: k, Err: err, Reclassified: true}
		}
	}
	return err
}

// KindOf returns the innermost meaningful kind in err's chain: the kind of
// the innermost classified error that is not Internal, unless a
// reclassifying layer (Reclassify) comes first from the outside, whose kind
// is final. An unclassified error is Internal. In a multi-error
// (errors.Join, fmt.Errorf with several %w) the first branch that carries a
// kind decides, as errors.As would find it.
func KindOf(err error) Kind {
	k, _ := kindOf(err)
	return k
}

func kindOf(err error) (Kind, bool) {
	best, found := Internal, false
	for err != nil {
		if e, ok := err.(*Error); ok {
			if e.Reclassified {
				return e.Kind, true
			}
			if e.Kind != Internal {
				best, found = e.Kind, true
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				if k, ok := kindOf(c); ok {
					return k, true
				}
			}
			return best, found
		default:
			return best, found
		}
	}
	return best, found
}

// FieldOf returns the field named by the outermost classified error of
// err's chain that names one, not looking beneath a reclassifying layer.
func FieldOf(err error) string {
	for err != nil {
		if e, ok := err.(*Error); ok {
			if e.Field != "" || e.Reclassified {
				return e.Field
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				if f := FieldOf(c); f != "" {
					return f
				}
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}

// Is reports whether err is of kind k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }

// Short keeps an error readable in an event message: the first line plus
// the lines that say "error", at most ~600 bytes. The full text belongs in
// the log.
func Short(err error) string {
	s := err.Error()
	if len(s) <= 600 {
		return s
	}
	lines := strings.Split(s, "\n")
	out := []string{lines[0]}
	for _, l := range lines[1:] {
		if strings.Contains(l, "Error") || strings.Contains(l, "error") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	msg := strings.Join(out, "\n")
	if len(msg) > 600 {
		msg = msg[:600] + "…"
	}
	return msg
}
