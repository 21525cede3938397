package daemon

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

func TestSelfPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/v1/sandboxes/self", "/v1/sandboxes/abc"},
		{"/v1/sandboxes/self/tasks", "/v1/sandboxes/abc/tasks"},
		{"/v1/sandboxes/self/tasks/t1/steps", "/v1/sandboxes/abc/tasks/t1/steps"},
		{"/v1/sandboxes/abc", "/v1/sandboxes/abc"},
		{"/v1/sandboxes/other", "/v1/sandboxes/other"}, // refused by the allowlist's id check
		{"/v1/sandboxes/selfish", "/v1/sandboxes/selfish"},
		{"/v1/secrets", "/v1/secrets"},
		{"/metrics", "/metrics"},
	} {
		got, err := selfPath(tc.in, "abc")
		if err != nil || got != tc.want {
			t.Errorf("selfPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "v1/sandboxes", "/v1/sandboxes/self/../other", "/v1/sandboxes//x",
		"/v1/sandboxes/./self", "/v1/sandboxes/%2e%2e", "/v1/sandboxes/self\x00", `/v1/sandboxes\self`, "v1/sandboxes/self"} {
		if got, err := selfPath(bad, "abc"); errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != "path" {
			t.Errorf("selfPath(%q) = %q, %v; want an InvalidArgument naming path", bad, got, err)
		}
	}
}

func TestSelfRate(t *testing.T) {
	s := &SelfAPI{buckets: map[string]*selfBucket{}}
	now := time.Unix(1000, 0)
	n := 0
	for s.allow("a", now) {
		n++
	}
	if n != selfBurst {
		t.Fatalf("burst = %d, want %d", n, selfBurst)
	}
	if !s.allow("b", now) {
		t.Fatal("another sandbox's budget is its own")
	}
	if s.allow("a", now.Add(5*time.Millisecond)) {
		t.Fatal("a token refilled too early")
	}
	if !s.allow("a", now.Add(20*time.Millisecond)) {
		t.Fatalf("no token after 20ms at %d/s", selfRate)
	}
}
