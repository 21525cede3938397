// Package httpx is the one helper set for JSON over HTTP and for errors on
// the wire, shared by berth's REST server (internal/server), the agent's HTTP
// surface (internal/agent, read by internal/agentapi) and the E2B-compatible
// surfaces (internal/e2b): bounded, strict request decoding whose errors name
// the offending field, JSON answers, and the error-kind → status tables.
//
// # Status tables
//
// One table per protocol, and a second one only where the protocol demands
// it. berth's own protocols (REST /v1 and the agent socket) and the E2B
// control plane share Status. E2B's envd REST routes (/files) use
// EnvdFilesStatus, because the E2B SDKs branch on those statuses (507 is
// NotEnoughSpaceError, 502 TimeoutError, 400 for a bad path). envd's Connect
// RPCs use Connect codes (internal/e2b's connectCode, listed here so the
// whole picture is in one place).
//
//	kind                 Status (REST, agent, E2B control plane)   EnvdFilesStatus (E2B /files)   Connect (E2B envd RPC)
//	internal             500                                       500                            internal
//	not_found            404                                       404                            not_found
//	already_exists       409                                       409                            already_exists
//	invalid_argument     400                                       400                            invalid_argument
//	failed_precondition  409                                       400                            failed_precondition
//	conflict             409                                       409                            aborted
//	resource_exhausted   429                                       507                            resource_exhausted
//	permission_denied    403                                       403                            permission_denied
//	unauthenticated      401                                       401                            unauthenticated
//	unavailable          503                                       502                            unavailable
//	not_implemented      501                                       501                            unimplemented
//
// A status does not carry the kind by itself (409 is three kinds): REST and
// agent error bodies name the kind ("reason" in REST's Error, "code" in the
// agent's), and clients decode that, not the status. KindOfStatus is the
// inverse for a body that names nothing.
//
// The same table is in docs/API.md ("Errors").
package httpx

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/errs"
)

var status = map[errs.Kind]int{
	errs.Internal:           http.StatusInternalServerError,
	errs.NotFound:           http.StatusNotFound,
	errs.AlreadyExists:      http.StatusConflict,
	errs.InvalidArgument:    http.StatusBadRequest,
	errs.FailedPrecondition: http.StatusConflict,
	errs.Conflict:           http.StatusConflict,
	errs.ResourceExhausted:  http.StatusTooManyRequests,
	errs.PermissionDenied:   http.StatusForbidden,
	errs.Unauthenticated:    http.StatusUnauthorized,
	errs.Unavailable:        http.StatusServiceUnavailable,
	errs.NotImplemented:     http.StatusNotImplemented,
}

// envdFiles differs from status where E2B's envd /files protocol says so.
var envdFiles = map[errs.Kind]int{
	errs.FailedPrecondition: http.StatusBadRequest,
	errs.ResourceExhausted:  http.StatusInsufficientStorage,
	errs.Unavailable:        http.StatusBadGateway,
}

// Status is the HTTP status of an error kind on REST /v1, the agent socket
// and the E2B control plane.
func Status(k errs.Kind) int {
	if s, ok := status[k]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// EnvdFilesStatus is the HTTP status of an error kind on E2B envd's REST
// routes (/files): a missing file 404 (FileNotFoundError), a directory or a
// bad path 400, a full disk 507 (NotEnoughSpaceError), a stopped agent 502
// (TimeoutError); the rest as Status.
func EnvdFilesStatus(k errs.Kind) int {
	if s, ok := envdFiles[k]; ok {
		return s
	}
	return Status(k)
}

// KindOfStatus is the inverse of Status for an answer whose body names no
// kind: 409 reads as Conflict (AlreadyExists and FailedPrecondition share
// it), an unknown status as Internal.
func KindOfStatus(st int) errs.Kind {
	for _, k := range errs.Kinds() {
		if k != errs.AlreadyExists && k != errs.FailedPrecondition && status[k] == st {
			return k
		}
	}
	return errs.Internal
}

// KindOf is errs.KindOf for an answer: a request the client gave up on
// (context.Canceled) is Unavailable, not Internal.
func KindOf(err error) errs.Kind {
	if errors.Is(err, context.Canceled) {
		return errs.Unavailable
	}
	return errs.KindOf(err)
}

// Error is the body of every non-2xx REST /v1 answer.
type Error = wire.Error

// ErrorBody is the REST body for err: its status, message, field and kind.
func ErrorBody(err error) Error {
	k := KindOf(err)
	st := Status(k)
	return Error{Code: st, Message: err.Error(), Field: errs.FieldOf(err), Reason: k.String()}
}

// WriteError answers err in REST form (Error, with Status).
func WriteError(w http.ResponseWriter, err error) {
	b := ErrorBody(err)
	WriteJSONIndent(w, b.Code, b)
}

// WriteJSON writes v as compact JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	writeJSON(w, status, v, false)
}

// WriteJSONIndent writes v as indented JSON with status (REST /v1, read by
// people with curl as often as by programs).
func WriteJSONIndent(w http.ResponseWriter, status int, v any) {
	writeJSON(w, status, v, true)
}

func writeJSON(w http.ResponseWriter, status int, v any, indent bool) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(v)
}
