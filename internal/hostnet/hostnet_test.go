package hostnet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCore is the lifecycle core as the service sees it, over a real
// SQLite store.
type testCore struct {
	st  store.Store
	dir string
	now time.Time

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	wg    sync.WaitGroup
}

func (c *testCore) Store() store.Store { return c.st }
func (c *testCore) Lock(id string) func() {
	c.mu.Lock()
	m, ok := c.locks[id]
	if !ok {
		m = &sync.Mutex{}
		c.locks[id] = m
	}
	c.mu.Unlock()
	m.Lock()
	return m.Unlock
}
func (c *testCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || (owner != "" && sb.Owner != owner) {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}
func (c *testCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	_, _ = c.st.AppendEvent(ctx, sandbox.Event{SandboxID: sb.ID, Owner: sb.Owner, Time: c.now, Actor: actor, Type: typ,
		Reason: reason, Message: msg, Data: data})
}
func (c *testCore) GoBackground(_ string, fn func(context.Context)) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); fn(context.Background()) }()
}
func (c *testCore) SandboxDir(id string) string { return filepath.Join(c.dir, "sandboxes", id) }
func (c *testCore) Log() *slog.Logger           { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func (c *testCore) Now() time.Time              { return c.now }

type noFeed struct{}

func (noFeed) NoteEgress(string, int) {}

func newTest(t *testing.T) (*Service, *testCore, *auth.Service) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	c := &testCore{st: st, dir: t.TempDir(), now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), locks: map[string]*sync.Mutex{}}
	t.Cleanup(func() { c.wg.Wait(); st.Close() })
	a := auth.New(st, c.dir, func() time.Time { return c.now }, []byte("0123456789abcdef0123456789abcdef"))
	return New(c, c.dir, a, noFeed{}), c, a
}

func rules(t *testing.T, ss ...string) []egress.Rule {
	t.Helper()
	var out []egress.Rule
	for _, s := range ss {
		r, err := egress.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// polDiff compares policies by their text form (rules hold netip values).
func polDiff(want, got egress.Policy) string {
	str := func(p egress.Policy) string {
		return string(p.Mode) + " allow=" + joinRules(p.Allow) + " deny=" + joinRules(p.Deny)
	}
	return cmp.Diff(str(want), str(got))
}

func TestPlanPolicy(t *testing.T) {
	for _, tc := range []struct {
		name         string
		def          egress.Mode
		enabled      bool
		mode         string
		allow, deny  []string
		want         egress.Mode
		wantA, wantD []string
		kind         errs.Kind // 0: success
	}{
		{name: "default deny", def: egress.DenyAll, enabled: true, want: egress.DenyAll},
		{name: "unset default is deny", def: "", enabled: true, want: egress.DenyAll},
		{name: "default allow", def: egress.AllowAll, enabled: true, want: egress.AllowAll},
		{name: "default allow with deny rules", def: egress.AllowAll, enabled: true, deny: []string{"10.1.0.0/16"},
			want: egress.AllowAll, wantD: []string{"10.1.0.0/16"}},
		{name: "default with allow rules", def: egress.AllowAll, enabled: true, allow: []string{"example.com"},
			want: egress.Rules, wantA: []string{"example.com"}},
		{name: "default deny with deny rules", def: egress.DenyAll, enabled: true, deny: []string{"*.evil.test"},
			want: egress.Rules, wantD: []string{"*.evil.test"}},
		{name: "deny-all with rules means rules", def: egress.AllowAll, enabled: true, mode: "deny-all",
			allow: []string{"pypi.org:443"}, want: egress.Rules, wantA: []string{"pypi.org:443"}},
		{name: "explicit allow-all", def: egress.DenyAll, enabled: true, mode: "allow-all", want: egress.AllowAll},
		{name: "explicit rules", def: egress.DenyAll, enabled: true, mode: "rules", allow: []string{"a.test"},
			want: egress.Rules, wantA: []string{"a.test"}},
		{name: "unknown mode", def: egress.DenyAll, enabled: true, mode: "open", kind: errs.InvalidArgument},
		{name: "bad rule", def: egress.DenyAll, enabled: true, allow: []string{"not a rule!"}, kind: errs.InvalidArgument},
		{name: "disabled: deny-all", enabled: false, mode: "deny-all", want: egress.DenyAll},
		{name: "disabled: rules allowing nothing", enabled: false, mode: "rules", deny: []string{"a.test"},
			want: egress.Rules, wantD: []string{"a.test"}},
		{name: "disabled: allow-all refused", enabled: false, mode: "allow-all", kind: errs.FailedPrecondition},
		{name: "disabled: allow rule refused", enabled: false, allow: []string{"a.test"}, kind: errs.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := PlanPolicy(tc.def, tc.enabled, tc.mode, tc.allow, tc.deny)
			if tc.kind != 0 {
				if !errs.Is(err, tc.kind) {
					t.Fatalf("PlanPolicy = %+v, %v; want kind %v", pol, err, tc.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := egress.Policy{Mode: tc.want, Allow: rules(t, tc.wantA...), Deny: rules(t, tc.wantD...)}
			if diff := polDiff(want, pol); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAllowHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		pol  egress.Policy
		host string
		want egress.Policy
	}{
		{"deny-all opens to rules", egress.Policy{Mode: egress.DenyAll}, "api.test",
			egress.Policy{Mode: egress.Rules, Allow: rules(t, "api.test")}},
		{"allow-all unchanged", egress.Policy{Mode: egress.AllowAll}, "api.test", egress.Policy{Mode: egress.AllowAll}},
		{"already allowed", egress.Policy{Mode: egress.Rules, Allow: rules(t, "api.test")}, "api.test",
			egress.Policy{Mode: egress.Rules, Allow: rules(t, "api.test")}},
		{"appended", egress.Policy{Mode: egress.Rules, Allow: rules(t, "a.test")}, "api.test",
			egress.Policy{Mode: egress.Rules, Allow: rules(t, "a.test", "api.test")}},
		{"unparsable host ignored", egress.Policy{Mode: egress.DenyAll}, "not a host!", egress.Policy{Mode: egress.DenyAll}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := polDiff(tc.want, allowHost(tc.pol, tc.host)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestInherit: a fork keeps its parent's policy and grants, never its ports
// or anything else.
func TestInherit(t *testing.T) {
	for _, tc := range []struct {
		name string
		net  sandbox.NetState
		want sandbox.NetState
	}{
		{"nothing", sandbox.NetState{}, sandbox.NetState{}},
		{"policy and grants; not ports nor the namespace", sandbox.NetState{Policy: json.RawMessage(`{"mode":"allow-all"}`),
			Secrets: []sandbox.SecretGrant{{Name: "K"}}, Ports: map[string]sandbox.PortGrant{"8080": {}}, NetnsPath: "/n"},
			sandbox.NetState{Policy: json.RawMessage(`{"mode":"allow-all"}`), Secrets: []sandbox.SecretGrant{{Name: "K"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := &sandbox.Sandbox{Attrs: sandbox.Attrs{Net: tc.net, UserNS: "none"}}
			got := Inherit(parent)
			if len(got.Secrets) > 0 {
				got.Secrets[0].Name = "changed" // the child's copy must not alias the parent's
				if parent.Net.Secrets[0].Name != "K" {
					t.Error("Inherit aliases the parent's grants")
				}
				got.Secrets[0].Name = "K"
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParsePortAndInfos(t *testing.T) {
	for in, ok := range map[string]bool{"1": true, "65535": true, "8080": true, "0": false, "65536": false, "-1": false, "x": false, "": false} {
		if _, err := parsePort(in); (err == nil) != ok {
			t.Errorf("parsePort(%q) = %v, want ok=%v", in, err, ok)
		}
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	got := portInfos(&sandbox.Sandbox{Attrs: sandbox.Attrs{Net: sandbox.NetState{
		Ports: map[string]portEntry{"8080": {CreatedAt: at}, "22": {TokenHash: "h", CreatedAt: at}}}}})
	want := []PortInfo{{Port: 22, Token: true, CreatedAt: at}, {Port: 8080, CreatedAt: at}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("portInfos (-want +got):\n%s", diff)
	}
}

func mkSandbox(t *testing.T, c *testCore, id, owner string, state sandbox.State, net sandbox.NetState) *sandbox.Sandbox {
	t.Helper()
	sb := &sandbox.Sandbox{ID: id, Owner: owner, Template: "default", State: state, CreatedAt: c.now, Attrs: sandbox.Attrs{Net: net}}
	if err := c.st.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestDisabled: a server without networking gives every sandbox deny-all
// and refuses what needs the network, naming why.
func TestDisabled(t *testing.T) {
	h, c, _ := newTest(t)
	ctx := t.Context()
	if h.Enabled() {
		t.Fatal("enabled before Start")
	}
	req := Request{Owner: "alice"}
	if err := h.Prepare(ctx, &req); err != nil {
		t.Fatal(err)
	}
	pol, err := egress.UnmarshalPolicy(req.Net.Policy)
	if err != nil || pol.Mode != egress.DenyAll {
		t.Errorf("default policy = %+v, %v; want deny-all", pol, err)
	}
	for _, r := range []Request{{Owner: "alice", Network: "allow-all"}, {Owner: "alice", Secrets: []string{"K"}}} {
		if err := h.Prepare(ctx, &r); !errs.Is(err, errs.FailedPrecondition) {
			t.Errorf("Prepare(%+v) = %v, want FailedPrecondition", r, err)
		}
	}
	if _, err := h.PutSecret(ctx, "alice", "K", "api.test", "", []byte("v")); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("PutSecret = %v, want FailedPrecondition", err)
	}
	mkSandbox(t, c, "sb1", "alice", sandbox.Running, sandbox.NetState{})
	if _, _, err := h.ExposePort(ctx, "alice", "sb1", 8080, false); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("ExposePort = %v, want FailedPrecondition", err)
	}
	if _, err := h.SetPolicy(ctx, "alice", "sb1", "alice", egress.Policy{Mode: egress.AllowAll}); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("SetPolicy(allow-all) = %v, want FailedPrecondition", err)
	}
	info, err := h.SetPolicy(ctx, "alice", "sb1", "alice", egress.Policy{Mode: egress.DenyAll})
	if err != nil || info.Policy.Mode != egress.DenyAll || info.Attached {
		t.Errorf("SetPolicy(deny-all) = %+v, %v", info, err)
	}
	if err := h.Up(ctx, &sandbox.Sandbox{ID: "x", Attrs: sandbox.Attrs{Net: sandbox.NetState{Policy: json.RawMessage(`{"mode":"allow-all"}`)}}}, ""); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("Up(allow-all) without networking = %v, want FailedPrecondition", err)
	}
	if h.Mounts(&sandbox.Sandbox{ID: "sb1"}) != nil || h.NetNSPath(&sandbox.Sandbox{ID: "sb1"}) != "" {
		t.Error("a disabled network mounts files or names a namespace")
	}
	h.Release() // no-op without networking
}

// TestPortsAuthorize: exposed ports answer to the owner's key, the admin
// key and the port's own token; another tenant's key or a wrong token is
// refused, and a port not exposed is NotFound.
func TestPortsAuthorize(t *testing.T) {
	h, c, a := newTest(t)
	ctx := t.Context()
	h.net = &netState{owners: map[string]string{}} // enough for the port book-keeping; no proxy
	mkSandbox(t, c, "sb1", "alice", sandbox.Running, sandbox.NetState{})
	mkSandbox(t, c, "sb2", "alice", sandbox.Paused, sandbox.NetState{})
	alice, _ := a.CreateKey(ctx, "alice", false)
	bob, _ := a.CreateKey(ctx, "bob", false)
	admin, _ := a.CreateKey(ctx, "admin", true)

	if _, _, err := h.ExposePort(ctx, "bob", "sb1", 8080, false); !errs.Is(err, errs.NotFound) {
		t.Errorf("bob exposes alice's port: %v, want NotFound", err)
	}
	if _, _, err := h.ExposePort(ctx, "alice", "sb1", 0, false); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("port 0: %v, want InvalidArgument", err)
	}
	pi, tok, err := h.ExposePort(ctx, "alice", "sb1", 8080, true)
	if err != nil || !pi.Token || !strings.HasPrefix(tok, "bpt_") {
		t.Fatalf("ExposePort = %+v, %q, %v", pi, tok, err)
	}
	if sb, _ := c.st.GetSandbox(ctx, "sb1"); strings.Contains(fmt.Sprint(sb.Net.Ports), tok) {
		t.Error("the port token is stored in clear")
	}
	if _, _, err := h.ExposePort(ctx, "alice", "sb1", 9090, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.ExposePort(ctx, "alice", "sb2", 8080, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, tok, id, port string
		kind                     errs.Kind
	}{
		{"owner key", alice, "", "sb1", "8080", 0},
		{"admin key", admin, "", "sb1", "8080", 0},
		{"port token", "", tok, "sb1", "8080", 0},
		{"token of another port", "", tok, "sb1", "9090", errs.PermissionDenied},
		{"other tenant", bob, "", "sb1", "8080", errs.PermissionDenied},
		{"wrong token", "", tok + "0", "sb1", "8080", errs.PermissionDenied},
		{"nothing", "", "", "sb1", "8080", errs.Unauthenticated},
		{"not exposed", alice, "", "sb1", "7070", errs.NotFound},
		{"bad port", alice, "", "sb1", "http", errs.InvalidArgument},
		{"no such sandbox", alice, "", "nope", "8080", errs.NotFound},
		{"not running", alice, "", "sb2", "8080", errs.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := h.AuthorizePort(ctx, tc.key, tc.tok, tc.id, tc.port)
			if tc.kind == 0 && err != nil || tc.kind != 0 && !errs.Is(err, tc.kind) {
				t.Errorf("AuthorizePort = %v, want kind %v", err, tc.kind)
			}
		})
	}
	// A replica's signed principal (cluster mode) stands for a key.
	for _, tc := range []struct {
		name string
		p    auth.Principal
		id   string
		kind errs.Kind
	}{
		{"cluster owner", auth.Principal{Owner: "alice", Cluster: true}, "sb1", 0},
		{"cluster admin", auth.Principal{Admin: true, Cluster: true}, "sb1", 0},
		{"cluster other tenant", auth.Principal{Owner: "bob", Cluster: true}, "sb1", errs.PermissionDenied},
		{"cluster, not running", auth.Principal{Owner: "alice", Cluster: true}, "sb2", errs.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := h.AuthorizePortAs(ctx, tc.p, tc.id, "8080")
			if tc.kind == 0 && err != nil || tc.kind != 0 && !errs.Is(err, tc.kind) {
				t.Errorf("AuthorizePortAs = %v, want kind %v", err, tc.kind)
			}
		})
	}
	// Exposing again replaces the token.
	if _, tok2, err := h.ExposePort(ctx, "alice", "sb1", 8080, true); err != nil || tok2 == tok {
		t.Fatalf("re-expose: %q, %v", tok2, err)
	}
	if err := h.AuthorizePort(ctx, "", tok, "sb1", "8080"); !errs.Is(err, errs.PermissionDenied) {
		t.Errorf("old token after re-expose: %v, want PermissionDenied", err)
	}
	if err := h.ClosePort(ctx, "alice", "sb1", 8080); err != nil {
		t.Fatal(err)
	}
	if err := h.ClosePort(ctx, "alice", "sb1", 8080); !errs.Is(err, errs.NotFound) {
		t.Errorf("close twice: %v, want NotFound", err)
	}
	ps, err := h.Ports(ctx, "alice", "sb1")
	if err != nil || len(ps) != 1 || ps[0].Port != 9090 || ps[0].Token {
		t.Errorf("Ports = %+v, %v; want 9090 only", ps, err)
	}
}

// TestSecretsGranted: a secret is sealed at rest, never shown, and a
// grant puts a placeholder (not the value) into the env and opens its
// host; a fork's inherited policy is kept and extended.
func TestSecretsGranted(t *testing.T) {
	h, c, _ := newTest(t)
	ctx := t.Context()
	sealer, err := egress.LoadOrCreateSealer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h.net = &netState{sealer: sealer, def: egress.DenyAll, owners: map[string]string{}}
	for _, tc := range []struct{ name, host string }{{"1BAD", "api.test"}, {"K", "api.test:443"}, {"K", "*.api.test"}} {
		if _, err := h.PutSecret(ctx, "alice", tc.name, tc.host, "", []byte("v")); !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("PutSecret(%q, %q) = %v, want InvalidArgument", tc.name, tc.host, err)
		}
	}
	info, err := h.PutSecret(ctx, "alice", "API_KEY", "api.test", "", []byte("s3cret-value"))
	if err != nil || info.Header != DefaultSecretHeader {
		t.Fatalf("PutSecret = %+v, %v", info, err)
	}
	stored, err := c.st.GetSecret(ctx, "alice", "API_KEY")
	if err != nil || strings.Contains(string(stored.Sealed), "s3cret-value") {
		t.Fatalf("secret not sealed at rest: %v", err)
	}
	// Another owner's name space is separate.
	r := Request{Owner: "bob", Secrets: []string{"API_KEY"}, Net: sandbox.NetState{Policy: json.RawMessage(`{"mode":"deny-all"}`)}}
	if err := h.Prepare(ctx, &r); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("bob is granted alice's secret: %v", err)
	}
	r = Request{Owner: "alice", Secrets: []string{"API_KEY"}, Env: map[string]string{"API_KEY": "x"},
		Net: sandbox.NetState{Policy: json.RawMessage(`{"mode":"deny-all"}`)}}
	if err := h.Prepare(ctx, &r); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("env clash: %v, want InvalidArgument", err)
	}
	// A fork's request: the parent's policy in Net, no mode named.
	r = Request{Owner: "alice", Secrets: []string{"API_KEY"},
		Net: sandbox.NetState{Policy: json.RawMessage(`{"mode":"rules","allow":["a.test"]}`)}}
	if err := h.Prepare(ctx, &r); err != nil {
		t.Fatal(err)
	}
	ph := r.Env["API_KEY"]
	if ph == "" || strings.Contains(ph, "s3cret") {
		t.Errorf("env carries %q, want a placeholder", ph)
	}
	pol, err := egress.UnmarshalPolicy(r.Net.Policy)
	if err != nil {
		t.Fatal(err)
	}
	if diff := polDiff(egress.Policy{Mode: egress.Rules, Allow: rules(t, "a.test", "api.test")}, pol); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	sb := mkSandbox(t, c, "sb1", "alice", sandbox.Running, r.Net)
	gs, err := h.grants(ctx, sb)
	if err != nil || len(gs) != 1 || gs[0].Value != "s3cret-value" || gs[0].Placeholder != ph || gs[0].Host != "api.test" {
		t.Errorf("grants = %+v, %v", gs, err)
	}
	list, err := h.ListSecrets(ctx, "alice")
	if err != nil || len(list) != 1 || list[0].Name != "API_KEY" {
		t.Errorf("ListSecrets = %+v, %v", list, err)
	}
	// Sealed for alice/API_KEY: the same bytes do not open as bob's.
	if _, err := sealer.Open(stored.Sealed, secretAAD("bob", "API_KEY")); err == nil {
		t.Error("a sealed secret opens under another owner's name")
	}
}
