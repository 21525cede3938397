package agent

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// httpStatus is the one place an errs.Kind becomes an HTTP status on the
// agent socket; the client decodes the kind from the body's code instead.
func httpStatus(k errs.Kind) int {
	switch k {
	case errs.NotFound:
		return http.StatusNotFound
	case errs.AlreadyExists, errs.Conflict:
		return http.StatusConflict
	case errs.InvalidArgument:
		return http.StatusBadRequest
	case errs.FailedPrecondition:
		return http.StatusPreconditionFailed
	case errs.ResourceExhausted:
		return http.StatusInsufficientStorage
	case errs.PermissionDenied:
		return http.StatusForbidden
	case errs.Unauthenticated:
		return http.StatusUnauthorized
	case errs.Unavailable:
		return http.StatusServiceUnavailable
	case errs.NotImplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

func writeError(w http.ResponseWriter, err error) {
	k := errs.KindOf(err)
	writeJSON(w, httpStatus(k), agentapi.Error{Code: k.String(), Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON strictly decodes a request body; unknown fields are errors.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "decode request body")
	}
	return nil
}

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errs.Field("pid", "must be a positive integer, got %q", r.PathValue("pid"))
	}
	return pid, nil
}

// keepaliveParam reads the keepalive=SECONDS query parameter (0 = none).
func keepaliveParam(r *http.Request) (time.Duration, error) {
	s := r.URL.Query().Get("keepalive")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, errs.Field("keepalive", "must be a non-negative number of seconds, got %q", s)
	}
	return time.Duration(n) * time.Second, nil
}

// ndjson writes one JSON value per line and flushes each, with an idle
// keepalive timer that callers reset on every write.
type ndjson struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	enc   *json.Encoder
	idle  time.Duration
	timer *time.Timer
}

func startNDJSON(w http.ResponseWriter, idle time.Duration) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	s := &ndjson{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w), idle: idle}
	if idle > 0 {
		s.timer = time.NewTimer(idle)
	}
	return s
}

func (s *ndjson) write(v any) error {
	if err := s.enc.Encode(v); err != nil {
		return err
	}
	if err := s.rc.Flush(); err != nil {
		return err
	}
	if s.timer != nil {
		s.timer.Reset(s.idle)
	}
	return nil
}

// keepalive fires after idle seconds without a write; nil (never) when off.
func (s *ndjson) keepalive() <-chan time.Time {
	if s.timer == nil {
		return nil
	}
	return s.timer.C
}

func (s *ndjson) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}
