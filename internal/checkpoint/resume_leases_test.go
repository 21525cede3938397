package checkpoint

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/leases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// resumeCore adds the state table to testCore (the daemon's Transition and
// TransitionLeases over the real store).
type resumeCore struct{ *testCore }

func (c resumeCore) Transition(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	return c.st.Transition(ctx, id, to, sandbox.Event{Actor: actor, Reason: reason, Time: c.now}, fn)
}

func (c resumeCore) TransitionLeases(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error) {
	return c.st.TransitionLeases(ctx, id, to, sandbox.Event{Actor: actor, Reason: reason, Time: c.now}, fn, ch)
}

// leaseCore is the lease service's core: files and proxy grants recorded.
type leaseCore struct {
	st    store.Store
	now   time.Time
	files map[string]string
	proxy map[string][]store.Lease
}

func (c *leaseCore) Visible(ctx context.Context, _, id string) (*sandbox.Sandbox, error) {
	return c.st.GetSandbox(ctx, id)
}
func (c *leaseCore) Lock(string) func() { return func() {} }
func (c *leaseCore) Now() time.Time     { return c.now }
func (c *leaseCore) Scope(context.Context, string, string) (leases.Scope, error) {
	return leases.Scope{Host: "api.test", Header: "Authorization"}, nil
}
func (c *leaseCore) WriteFiles(sb *sandbox.Sandbox, file []byte, _ bool) error {
	c.files[sb.ID] = string(file)
	return nil
}
func (c *leaseCore) Refresh(context.Context, *sandbox.Sandbox, bool) error { return nil }
func (c *leaseCore) PrepareProxyLeases(_ context.Context, sb *sandbox.Sandbox, ls []store.Lease) (func() error, error) {
	return func() error { c.proxy[sb.ID] = ls; return nil }, nil
}

// TestResumeFoldsLeaseReissue: commitResume writes the reissue with the
// move to running; a plan overtaken before the commit writes no lease, the
// state is committed alone and the resumed hook reissues (nothing is left
// running with the old generation active and nothing said).
func TestResumeFoldsLeaseReissue(t *testing.T) {
	ctx := t.Context()
	st := openStore(t)
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	lc := &leaseCore{st: st, now: now, files: map[string]string{}, proxy: map[string][]store.Lease{}}
	ls := leases.New(lc, st, leases.Config{})
	s := &Service{core: resumeCore{&testCore{st: st, dir: t.TempDir(), now: now}}, cfg: Config{Leases: ls}, log: slog.New(slog.DiscardHandler)}

	mk := func(id string) *sandbox.Sandbox {
		sb := &sandbox.Sandbox{ID: id, Owner: "alice", Template: "tiny", TemplateID: "x", Runtime: "runc", State: sandbox.Resuming,
			Env: map[string]string{"TOKEN": "berth-secret-TOKEN-" + id}}
		sb.Net.Secrets = []sandbox.SecretGrant{{Name: "TOKEN", Placeholder: sb.Env["TOKEN"]}}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if _, err := ls.ProxyLeases(ctx, sb); err != nil { // generation 1
			t.Fatal(err)
		}
		return sb
	}
	gen := func(id string) (active []int) {
		all, _ := st.ListLeases(ctx, store.LeaseFilter{SandboxID: id})
		for _, l := range all {
			if l.State == store.LeaseActive {
				active = append(active, l.Generation)
			}
		}
		return active
	}
	resume := func(sb *sandbox.Sandbox, overtake func()) (*sandbox.Sandbox, bool) {
		t.Helper()
		write := make(chan bool, 1)
		write <- true
		wait := s.planReissue(ctx, sb, "alice", write)
		p := wait()
		if p.err != nil || p.re == nil || !p.wrote {
			t.Fatalf("plan: %+v", p)
		}
		if overtake != nil {
			overtake()
		}
		out, folded, fileErr, err := s.commitResume(ctx, sb.ID, "alice", "", p, func(x *sandbox.Sandbox) { x.ResumedFrom = sandbox.PauseFreeze })
		if err != nil || fileErr != nil || out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseFreeze {
			t.Fatalf("commitResume = %+v, %v, %v", out, fileErr, err)
		}
		if folded {
			if err := p.re.Committed(ctx, out); err != nil {
				t.Fatal(err)
			}
		}
		return out, folded
	}

	a := mk("sba")
	out, folded := resume(a, nil)
	if !folded || len(gen("sba")) != 1 || gen("sba")[0] != 2 {
		t.Fatalf("folded %v, active generations %v, want folded and [2]", folded, gen("sba"))
	}
	cur := out.Env["TOKEN"]
	if cur == a.Env["TOKEN"] || out.Net.Secrets[0].Placeholder != cur || lc.files["sba"] != "TOKEN="+cur+"\n" {
		t.Errorf("after the folded resume: env %v grants %v leases.env %q", out.Env, out.Net.Secrets, lc.files["sba"])
	}
	if px := lc.proxy["sba"]; len(px) != 2 || px[0].State != store.LeaseActive || px[0].Placeholder != cur {
		t.Errorf("proxy leases %+v", px)
	}

	// Overtaken: another lease change lands between the plan and the commit.
	b := mk("sbb")
	out, folded = resume(b, func() {
		extra := store.Lease{ID: "lx", SandboxID: "sbb", Owner: "alice", Generation: 1, Secret: "OTHER", Host: "api.test",
			Placeholder: "ph-other", IssuedAt: now, State: store.LeaseActive, ChangedAt: now}
		if err := st.ApplyLeases(ctx, "sbb", nil, []store.Lease{extra}, nil); err != nil {
			t.Fatal(err)
		}
	})
	if folded || len(gen("sbb")) != 2 || out.Env["TOKEN"] != b.Env["TOKEN"] {
		t.Fatalf("overtaken: folded %v, active generations %v, env %v; want the state alone", folded, gen("sbb"), out.Env)
	}
	if err := ls.OnState(ctx, statehook.Event{Phase: statehook.Resumed, Sandbox: out, Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	if g := gen("sbb"); len(g) != 1 || g[0] != 2 {
		t.Errorf("after the hook: active generations %v, want [2]", g)
	}
}
