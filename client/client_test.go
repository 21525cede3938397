//go:build linux

package client_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/oci"
	"github.com/berth-dev/berth/internal/server"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// startServer runs berth's real REST handlers, daemon and SQLite store on
// a temporary data dir, in process and without root: everything but
// starting a sandbox works (the runtime's binary is never run). It answers
// a client with the admin key.
func startServer(t *testing.T) (*client.Client, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpl, err := template.Open(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := oci.New("runsc", oci.Config{Binary: "true", Root: filepath.Join(dir, "runtime"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable() // any ELF stands in for berth-agent: no sandbox is started
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{DataDir: dir, DefaultRuntime: "runsc", AgentPath: self, Log: log},
		st, map[string]runtime.Runtime{"runsc": rt}, tpl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	key, err := d.Auth().EnsureAdminKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(d, log))
	t.Cleanup(srv.Close)
	return client.New(srv.URL, key), srv
}

func TestInfoAndKeys(t *testing.T) {
	ctx := context.Background()
	c, srv := startServer(t)
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Admin || len(in.Runtimes) != 1 || in.Runtimes[0].Name != "runsc" || !in.Runtimes[0].Default {
		t.Fatalf("info = %+v, want the admin and one default runtime runsc", in)
	}
	k, err := c.CreateKey(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	alice := client.New(srv.URL, k.Key)
	if in, err := alice.Info(ctx); err != nil || in.Owner != "alice" || in.Admin {
		t.Fatalf("alice's info = %+v, %v", in, err)
	}
	// alice may not create keys: the server's kind and status come through.
	_, err = alice.CreateKey(ctx, "bob")
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Kind != client.KindPermissionDenied || ae.StatusCode != http.StatusForbidden {
		t.Fatalf("alice creating a key: %v (%+v), want permission_denied 403", err, ae)
	}
	bad := client.New(srv.URL, "not-a-key")
	if _, err := bad.Info(ctx); client.KindOf(err) != client.KindUnauthenticated {
		t.Fatalf("bad key: %v, want unauthenticated", err)
	}
}

func TestErrorsCarryKindAndField(t *testing.T) {
	ctx := context.Background()
	c, _ := startServer(t)
	_, err := c.Create(ctx, wire.CreateRequest{TTL: "soon"})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Kind != client.KindInvalidArgument || ae.Field != "ttl" || ae.StatusCode != 400 {
		t.Fatalf("create with a bad ttl: %v (%+v), want invalid_argument on field ttl", err, ae)
	}
	_, err = c.Sandbox("nosuchsandbox").Get(ctx)
	if !client.IsNotFound(err) {
		t.Fatalf("get of a missing sandbox: %v, want not_found", err)
	}
	if _, err := c.Sandbox("nosuchsandbox").Exec(ctx, wire.ExecRequest{Cmd: []string{"true"}}); !client.IsNotFound(err) {
		t.Fatalf("exec in a missing sandbox: %v, want not_found", err)
	}
	if _, err := c.Sandbox("nosuchsandbox").ReadFile(ctx, "/etc/hostname", ""); !client.IsNotFound(err) {
		t.Fatalf("read in a missing sandbox: %v, want not_found", err)
	}
	// Nobody listening: unavailable, status 0, the transport error inside.
	dead := client.New("http://127.0.0.1:1", "k")
	err = dead.Health(ctx)
	if !errors.As(err, &ae) || ae.Kind != client.KindUnavailable || ae.StatusCode != 0 || ae.Err == nil {
		t.Fatalf("unreachable server: %v, want unavailable with status 0", err)
	}
}

func TestListsAndAdminObjects(t *testing.T) {
	ctx := context.Background()
	c, _ := startServer(t)
	all, err := c.ListAll(ctx, client.ListOptions{States: []wire.State{wire.StateRunning}})
	if err != nil || all == nil || len(all) != 0 {
		t.Fatalf("ListAll = %v, %v; want an empty, non-nil list", all, err)
	}
	if l, err := c.Templates(ctx); err != nil || len(l) != 0 {
		t.Fatalf("templates = %v, %v", l, err)
	}
	if l, err := c.Snapshots(ctx, ""); err != nil || len(l) != 0 {
		t.Fatalf("snapshots = %v, %v", l, err)
	}
	if l, err := c.Pools(ctx); err != nil || len(l) != 0 {
		t.Fatalf("pools = %v, %v", l, err)
	}
	if l, err := c.Events(ctx, client.EventsOptions{}); err != nil || l == nil {
		t.Fatalf("events = %v, %v", l, err)
	}

	// This server runs without networking: secrets are refused, and say why.
	_, err = c.PutSecret(ctx, "", "gh", wire.SecretRequest{Host: "api.github.com", Value: "s3cret"})
	if k := client.KindOf(err); k == "" || k == client.KindInternal || !strings.Contains(err.Error(), "networking is disabled") {
		t.Fatalf("put secret without networking: %v (kind %q)", err, k)
	}

	qi, err := c.SetQuota(ctx, "alice", wire.QuotaLimits{Sandboxes: 3, CPU: 2})
	if err != nil || qi.Owner != "alice" || qi.Limits.Sandboxes != 3 || qi.Limits.CPU != 2 || qi.Source != "stored" {
		t.Fatalf("set quota = %+v, %v", qi, err)
	}
	if got, err := c.Quota(ctx, "alice"); err != nil || got.Limits != qi.Limits {
		t.Fatalf("quota = %+v, %v; want %+v", got, err, qi.Limits)
	}
	if _, err := c.SetQuota(ctx, "alice", wire.QuotaLimits{Sandboxes: -1}); client.KindOf(err) != client.KindInvalidArgument {
		t.Fatalf("negative quota: %v, want invalid_argument", err)
	}
	if err := c.DeleteQuota(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Usage(ctx, client.UsageOptions{SinceText: "7d"})
	if err != nil || rep.Prices.Currency == "" {
		t.Fatalf("usage = %+v, %v", rep, err)
	}
	if _, err := c.Usage(ctx, client.UsageOptions{SinceText: "yesterday-ish"}); client.KindOf(err) != client.KindInvalidArgument {
		t.Fatalf("bad since: %v, want invalid_argument", err)
	}
	orph, err := c.Orphans(ctx, 7, "")
	if err != nil || orph.Days != 7 || orph.Items == nil {
		t.Fatalf("orphans = %+v, %v", orph, err)
	}
	// A template pull of a malformed image reference is refused before any
	// stream starts: an ordinary error, kind and field intact.
	_, err = c.PullTemplate(ctx, "x", wire.PullRequest{Image: ""}, nil)
	if client.KindOf(err) != client.KindInvalidArgument {
		t.Fatalf("pull with no image: %v, want invalid_argument", err)
	}
}

// TestDoIsBounded: an error body is read up to a bound, never whole.
func TestDoIsBounded(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.Copy(w, io.LimitReader(zeros{}, 64<<20))
	}))
	defer huge.Close()
	err := client.New(huge.URL, "k").Health(context.Background())
	var ae *client.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadGateway || ae.Kind != client.KindInternal || len(ae.Message) > 2<<20 {
		t.Fatalf("huge error body: status %d kind %q, %d bytes of message", ae.StatusCode, ae.Kind, len(ae.Message))
	}
	if !strings.Contains(ae.Message, "HTTP 502") {
		t.Fatalf("message %q does not name the status", ae.Message[:80])
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '0'
	}
	return len(p), nil
}

// TestKindConstants: the client's kind names are the server's, all of them.
func TestKindConstants(t *testing.T) {
	mine := map[string]bool{}
	for _, k := range []string{client.KindNotFound, client.KindAlreadyExists, client.KindInvalidArgument,
		client.KindFailedPrecondition, client.KindConflict, client.KindResourceExhausted, client.KindPermissionDenied,
		client.KindUnauthenticated, client.KindUnavailable, client.KindNotImplemented, client.KindInternal} {
		mine[k] = true
	}
	for _, k := range errs.Kinds() {
		if !mine[k.String()] {
			t.Errorf("the server's kind %q has no client constant", k)
		}
		delete(mine, k.String())
	}
	for k := range mine {
		t.Errorf("client constant %q is no server kind", k)
	}
}
