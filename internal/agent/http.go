package agent

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
)

// writeError answers err with httpx's status table (the same as REST's);
// the client decodes the kind from the body's code, not from the status.
func writeError(w http.ResponseWriter, err error) {
	k := errs.KindOf(err)
	httpx.WriteJSON(w, httpx.Status(k), agentapi.Error{Code: k.String(), Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpx.WriteJSON(w, status, v) }

// decodeJSON strictly decodes a bounded request body; unknown or mistyped
// fields are errors naming the field.
func decodeJSON(r *http.Request, v any) error { return httpx.Decode(r, v) }

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
	return s.flush()
}

// writeLast writes a stream's last value without flushing it: the handler
// returns next, and net/http sends it together with the end of the chunked
// answer in one write, so the daemon reads the exit and the end at once (one
// socket write, one wake-up across the channel instead of two).
func (s *ndjson) writeLast(v any) error { return s.enc.Encode(v) }

func (s *ndjson) flush() error {
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
