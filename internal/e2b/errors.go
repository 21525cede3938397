package e2b

import (
	"errors"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
)

// This file is where berth error kinds become E2B statuses: the control
// plane's REST API uses httpx.Status (the same table as berth's REST),
// envd's REST routes (/files) httpx.EnvdFilesStatus, envd's Connect RPCs
// connectCode. internal/httpx's package doc has the three side by side.

// controlPlaneStatus maps an error kind to the control plane's HTTP status.
// The SDK branches on the numeric body code: 404 and 409 carry per-endpoint
// meaning (kill → false, pause → false), 401 → AuthenticationError,
// 429 → RateLimitError, 503 → ServiceBusyError.
func controlPlaneStatus(k errs.Kind) int { return httpx.Status(k) }

// filesStatus maps an error kind to envd's REST status (§8): a missing file is
// 404 (FileNotFoundError), a directory or bad path 400, an unknown user 401,
// a full disk 507 (NotEnoughSpaceError), a stopped agent 502 (TimeoutError).
func filesStatus(k errs.Kind) int { return httpx.EnvdFilesStatus(k) }

// connectCode maps an error kind to a Connect code. The SDK turns
// not_found/already_exists into per-call results (exists → false, makeDir →
// false, kill → false) and unavailable into TimeoutError.
func connectCode(k errs.Kind) connect.Code {
	switch k {
	case errs.NotFound:
		return connect.CodeNotFound
	case errs.AlreadyExists:
		return connect.CodeAlreadyExists
	case errs.InvalidArgument:
		return connect.CodeInvalidArgument
	case errs.FailedPrecondition:
		return connect.CodeFailedPrecondition
	case errs.Conflict:
		return connect.CodeAborted
	case errs.ResourceExhausted:
		return connect.CodeResourceExhausted
	case errs.PermissionDenied:
		return connect.CodePermissionDenied
	case errs.Unauthenticated:
		return connect.CodeUnauthenticated
	case errs.Unavailable:
		return connect.CodeUnavailable
	case errs.NotImplemented:
		return connect.CodeUnimplemented
	default:
		return connect.CodeInternal
	}
}

// connectError converts err for a Connect handler, keeping its message.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return connect.NewError(connectCode(errs.KindOf(err)), err)
}

// apiError is the body of every non-2xx E2B REST answer.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) { httpx.WriteJSON(w, status, v) }

// writeStatus writes an E2B error body {code, message} with status.
func writeStatus(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// writeAPIError answers a control-plane error.
func (s *Server) writeAPIError(w http.ResponseWriter, r *http.Request, err error) {
	status := controlPlaneStatus(errs.KindOf(err))
	s.logFailure(r, status, err)
	writeStatus(w, status, err.Error())
}

// writeFilesError answers an envd REST error.
func (s *Server) writeFilesError(w http.ResponseWriter, r *http.Request, err error) {
	status := filesStatus(errs.KindOf(err))
	s.logFailure(r, status, err)
	writeStatus(w, status, err.Error())
}

func (s *Server) logFailure(r *http.Request, status int, err error) {
	lvl := slog.LevelDebug
	if status >= 500 && status != http.StatusNotImplemented && status != http.StatusBadGateway {
		lvl = slog.LevelError
	}
	s.log.Log(r.Context(), lvl, "e2b request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
}
