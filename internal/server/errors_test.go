package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

// Every error kind maps to one HTTP status on REST, and the body names the kind.
func TestErrorMapping(t *testing.T) {
	want := map[errs.Kind]int{
		errs.Internal: 500, errs.NotFound: 404, errs.AlreadyExists: 409, errs.InvalidArgument: 400,
		errs.FailedPrecondition: 409, errs.Conflict: 409, errs.ResourceExhausted: 429,
		errs.PermissionDenied: 403, errs.Unauthenticated: 401, errs.Unavailable: 503, errs.NotImplemented: 501,
	}
	for _, k := range errs.Kinds() {
		st, ok := want[k]
		if !ok {
			t.Fatalf("kind %v has no expected status in this test", k)
		}
		if got := httpStatus(k); got != st {
			t.Errorf("httpStatus(%v) = %d, want %d", k, got, st)
		}
		rec := httptest.NewRecorder()
		writeError(rec, fmt.Errorf("context: %w", errs.E(k, "boom")))
		var body Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != st || body.Code != st || body.Reason != k.String() || body.Message == "" {
			t.Errorf("writeError(%v) = %d %+v", k, rec.Code, body)
		}
	}
	rec := httptest.NewRecorder()
	writeError(rec, errs.Field("ttl", "must be positive"))
	var body Error
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != http.StatusBadRequest || body.Field != "ttl" {
		t.Errorf("field error: %d %+v", rec.Code, body)
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]string{"": "0s", "90": "1m30s", "15m": "15m0s", "1d": "24h0m0s", "1.5h": "1h30m0s"} {
		got, err := ParseDuration(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"soon", "1x", "d"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) succeeded", bad)
		}
	}
}
