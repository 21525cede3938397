package kubestore

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// The API calls each operation makes, counted by a proxy in front of the
// real API server: the store's speed is mostly its round trips, and these
// bounds keep a change from quietly adding one to a hot path. An event
// costs 2 and its activity-timeline entry (SQLite's trigger) up to 5 more:
// the sandbox's existence, the timeline's counter, the entry, its pruning.
func TestCallsPerOperation(t *testing.T) {
	ctx := t.Context()
	up, err := url.Parse(srv.Config.Server)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // the test server's own certificate
	proxy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	kc, err := kube.New(kube.Config{Server: proxy.URL, Token: srv.Config.Token, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, kc, srv.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	// Warm the counter cache (the first event creates the counter).
	if _, err := s.AppendEvent(ctx, sandbox.Event{Type: "note"}); err != nil {
		t.Fatal(err)
	}
	key := store.APIKey{ID: "k", Owner: "a", Hash: []byte{1}}
	for _, tc := range []struct {
		name string
		max  int64
		op   func() error
	}{
		{"CreateSandbox", 1, func() error {
			return s.CreateSandbox(ctx, &sandbox.Sandbox{ID: "sb", Owner: "a", State: sandbox.Creating, AccessTokenHash: "t"})
		}},
		{"GetSandbox", 1, func() error { _, err := s.GetSandbox(ctx, "sb"); return err }},
		{"SandboxByTokenHash", 1, func() error { _, err := s.SandboxByTokenHash(ctx, "t"); return err }},
		{"ListSandboxes", 1, func() error { _, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "a"}); return err }},
		{"UpdateSandbox", 2, func() error {
			_, err := s.UpdateSandbox(ctx, "sb", func(sb *sandbox.Sandbox) error { sb.Message = "x"; return nil })
			return err
		}},
		{"Transition", 8, func() error { _, err := s.Transition(ctx, "sb", sandbox.Running, sandbox.Event{}, nil); return err }},
		{"AppendEvent", 7, func() error { _, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "sb", Type: "note"}); return err }},
		{"CreateAPIKey", 2, func() error { return s.CreateAPIKey(ctx, key) }},
		{"LookupAPIKey", 1, func() error { _, err := s.LookupAPIKey(ctx, key.Hash); return err }},
		{"PutTemplate", 2, func() error {
			_, err := s.PutTemplate(ctx, store.Template{Name: "t", State: store.TemplateReady})
			return err
		}},
		{"PutTemplate again", 2, func() error {
			_, err := s.PutTemplate(ctx, store.Template{Name: "t", State: store.TemplateReady})
			return err
		}},
		{"DeleteSandbox", 2, func() error { return s.DeleteSandbox(ctx, "sb") }},
	} {
		before := calls.Load()
		if err := tc.op(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		n := calls.Load() - before
		t.Logf("%-18s %d API calls", tc.name, n)
		if n > tc.max {
			t.Errorf("%s made %d API calls, want at most %d", tc.name, n, tc.max)
		}
	}
}
