package leases

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// testCore is the lifecycle core as the service sees it, over a real
// SQLite store: Publish and Withdraw update the stored sandbox as the
// daemon's adapter does, and record what the sandbox was told.
type testCore struct {
	st      *store.SQLite
	now     time.Time
	mu      sync.Mutex
	files   map[string]string // sandbox → last leases.env
	refresh int
	freezes int
	proxied map[string][]store.Lease // sandbox → last SetProxyLeases
}

func (c *testCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || (owner != "" && sb.Owner != owner) {
		return nil, errs.E(errs.NotFound, "sandbox %s not found", id)
	}
	return sb, nil
}
func (c *testCore) Lock(string) func() { return func() {} }
func (c *testCore) Now() time.Time     { return c.now }
func (c *testCore) Scope(_ context.Context, _, secret string) (Scope, error) {
	if secret == "GONE" {
		return Scope{}, errs.E(errs.NotFound, "secret %s not found", secret)
	}
	return Scope{Host: "api.test", Header: "Authorization"}, nil
}
func (c *testCore) WriteFiles(sb *sandbox.Sandbox, file []byte, _ bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.files[sb.ID] = string(file)
	return nil
}

func (c *testCore) Refresh(_ context.Context, _ *sandbox.Sandbox, freeze bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if freeze {
		c.freezes++
	} else {
		c.refresh++
	}
	return nil
}

func (c *testCore) PrepareProxyLeases(_ context.Context, sb *sandbox.Sandbox, ls []store.Lease) (func() error, error) {
	return func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.proxied[sb.ID] = ls
		return nil
	}, nil
}

type auditLog struct {
	mu      sync.Mutex
	actions []string
}

func (a *auditLog) Audit(_ context.Context, actor, action, sb string, data map[string]string) {
	a.mu.Lock()
	a.actions = append(a.actions, actor+" "+action+" "+sb+" "+data["reason"])
	a.mu.Unlock()
}

func newTest(t *testing.T) (*Service, *testCore, *auditLog) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &testCore{st: st, now: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), files: map[string]string{}, proxied: map[string][]store.Lease{}}
	a := &auditLog{}
	return New(c, st, Config{Auditor: a}), c, a
}

func mkSandbox(t *testing.T, c *testCore, id, owner string, secrets ...string) *sandbox.Sandbox {
	sb := &sandbox.Sandbox{ID: id, Owner: owner, Template: "tiny", TemplateID: "x", Runtime: "runc", State: sandbox.Running,
		Env: map[string]string{}, Labels: map[string]string{}}
	for _, s := range secrets {
		ph := "berth-secret-" + s + "-" + id
		sb.Net.Secrets = append(sb.Net.Secrets, sandbox.SecretGrant{Name: s, Placeholder: ph})
		sb.Env[s] = ph
	}
	if err := c.st.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

func states(ls []store.Lease) map[string]string {
	m := map[string]string{}
	for _, l := range ls {
		m[l.ID] = l.State
	}
	return m
}

// TestServiceLifecycle walks one sandbox through the state table's
// credential row with the real store, and a fork and a restore beside it.
func TestServiceLifecycle(t *testing.T) {
	s, c, audit := newTest(t)
	ctx := t.Context()
	a := mkSandbox(t, c, "sba", "alice", "TOKEN", "GONE")
	get := func(id string) *sandbox.Sandbox {
		sb, err := c.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}

	// First registration with the proxy issues generation 1 with the env's placeholder.
	pl, err := s.ProxyLeases(ctx, a)
	if err != nil || len(pl) != 1 || pl[0].Placeholder != a.Env["TOKEN"] || pl[0].Generation != 1 || pl[0].State != store.LeaseActive {
		t.Fatalf("ProxyLeases = %+v, %v", pl, err)
	}
	if again, _ := s.ProxyLeases(ctx, a); len(again) != 1 || again[0].ID != pl[0].ID {
		t.Errorf("a second registration issued again: %+v", again)
	}
	first := pl[0]

	fire := func(ev statehook.Event) {
		t.Helper()
		if err := s.OnState(ctx, ev); err != nil {
			t.Fatalf("%s: %v", ev.Phase, err)
		}
	}
	if _, err := c.st.UpdateSandbox(ctx, "sba", func(x *sandbox.Sandbox) error { x.State = sandbox.Paused; return nil }); err != nil {
		t.Fatal(err)
	}
	fire(statehook.Event{Phase: statehook.Paused, Sandbox: get("sba"), Actor: "alice"})
	if ls, _ := s.List(ctx, "alice", "sba"); len(ls) != 1 || ls[0].State != store.LeaseFrozen || ls[0].Reason != ReasonPaused || c.freezes != 1 {
		t.Errorf("after pause: %+v (proxy frozen %d times)", ls, c.freezes)
	}
	if pl, _ := s.ProxyLeases(ctx, get("sba")); len(pl) != 1 || pl[0].State != store.LeaseFrozen {
		t.Errorf("the proxy's leases of a paused sandbox: %+v", pl)
	}
	if _, err := c.st.UpdateSandbox(ctx, "sba", func(x *sandbox.Sandbox) error { x.State = sandbox.Running; return nil }); err != nil {
		t.Fatal(err)
	}
	fire(statehook.Event{Phase: statehook.Resumed, Sandbox: get("sba"), Actor: "alice"})
	ls, _ := s.List(ctx, "alice", "sba")
	if len(ls) != 2 || ls[0].State != store.LeaseRevoked || ls[0].Reason != ReasonResumed || ls[1].State != store.LeaseActive || ls[1].Generation != 2 {
		t.Fatalf("after resume: %+v", ls)
	}
	second := ls[1]
	if sb := get("sba"); sb.Env["TOKEN"] != second.Placeholder || sb.Net.Secrets[0].Placeholder != second.Placeholder || second.Placeholder == first.Placeholder {
		t.Errorf("env after resume %v, grants %v, lease %s", sb.Env, sb.Net.Secrets, second.Placeholder)
	}
	if f := c.files["sba"]; f != "TOKEN="+second.Placeholder+"\n" {
		t.Errorf("leases.env = %q", f)
	}

	// A fork child inherits the env (the parent's placeholder) and gets a fresh lease.
	mkSandbox(t, c, "sbc", "alice")
	if _, err := c.st.UpdateSandbox(ctx, "sbc", func(x *sandbox.Sandbox) error {
		x.Net.Secrets = []sandbox.SecretGrant{{Name: "TOKEN", Placeholder: second.Placeholder}}
		x.Env = map[string]string{"TOKEN": second.Placeholder}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProxyLeases(ctx, get("sbc")); err != nil { // the child's boot
		t.Fatal(err)
	}
	fire(statehook.Event{Phase: statehook.Forked, Sandbox: get("sbc"), From: "sba"})
	cl, _ := s.List(ctx, "alice", "sbc")
	if len(cl) != 1 || cl[0].Placeholder == second.Placeholder || get("sbc").Env["TOKEN"] != cl[0].Placeholder {
		t.Errorf("child leases %+v env %v", cl, get("sbc").Env)
	}
	if l, _ := c.st.GetLease(ctx, second.ID); l.State != store.LeaseActive {
		t.Errorf("the parent's lease after the fork: %s", l.State)
	}

	// Rewind in place re-issues; a restore into a new sandbox only ensures.
	fire(statehook.Event{Phase: statehook.Restored, Sandbox: get("sba"), From: "sba", Checkpoint: "ck"})
	if ls, _ := s.List(ctx, "alice", "sba"); len(ls) != 3 || ls[1].State != store.LeaseRevoked || ls[1].Reason != ReasonRestored || ls[2].Generation != 3 {
		t.Errorf("after rewind: %+v", ls)
	}

	// Another owner can neither list nor revoke.
	if _, err := s.List(ctx, "bob", "sba"); !errs.Is(err, errs.NotFound) {
		t.Errorf("bob lists alice's: %v", err)
	}
	if _, err := s.Revoke(ctx, "bob", "bob", cl[0].ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("bob revokes alice's: %v", err)
	}
	if all, _ := s.ListAll(ctx, "bob"); len(all) != 0 {
		t.Errorf("bob's list: %+v", all)
	}

	// Revoke withdraws the grant: a resume does not issue it again.
	refresh := c.refresh
	r, err := s.Revoke(ctx, "alice", "alice", cl[0].ID)
	if err != nil || r.State != store.LeaseRevoked || r.Reason != ReasonRevoked || c.refresh != refresh+1 {
		t.Fatalf("Revoke = %+v, %v (refreshes %d → %d)", r, err, refresh, c.refresh)
	}
	if len(get("sbc").Net.Secrets) != 0 {
		t.Errorf("grant after revoke: %v", get("sbc").Net.Secrets)
	}
	fire(statehook.Event{Phase: statehook.Paused, Sandbox: get("sbc")})
	fire(statehook.Event{Phase: statehook.Resumed, Sandbox: get("sbc")})
	if cl, _ := s.List(ctx, "", "sbc"); len(cl) != 1 || cl[0].State != store.LeaseRevoked {
		t.Errorf("child after revoke + resume: %+v", cl)
	}
	if pl, _ := s.ProxyLeases(ctx, get("sbc")); len(pl) != 1 || pl[0].State != store.LeaseRevoked {
		t.Errorf("the proxy still knows the revoked lease (to log its use): %+v", pl)
	}
	if all, _ := s.ListAll(ctx, ""); len(states(all)) != 4 {
		t.Errorf("all leases: %+v", all)
	}
	var revokes int
	for _, a := range audit.actions {
		if strings.Contains(a, "lease.revoke") {
			revokes++
		}
	}
	if revokes != 3 { // resumed, restored, revoked
		t.Errorf("audit: %d revocations in %v", revokes, audit.actions)
	}
}
