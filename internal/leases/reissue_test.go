package leases

import (
	"testing"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// TestReissueFolded: a resume's reissue planned ahead and written with the
// move to running (store.TransitionLeases), as checkpoint.ResumeAs does;
// a plan overtaken by another change writes nothing.
func TestReissueFolded(t *testing.T) {
	s, c, audit := newTest(t)
	ctx := t.Context()
	mkSandbox(t, c, "sba", "alice", "TOKEN")
	get := func() *sandbox.Sandbox {
		sb, err := c.st.GetSandbox(ctx, "sba")
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	first, err := s.ProxyLeases(ctx, get())
	if err != nil || len(first) != 1 {
		t.Fatalf("ProxyLeases = %+v, %v", first, err)
	}
	if _, err := c.st.UpdateSandbox(ctx, "sba", func(x *sandbox.Sandbox) error { x.State = sandbox.Resuming; return nil }); err != nil {
		t.Fatal(err)
	}
	commit := func(re *Reissue) (*sandbox.Sandbox, error) {
		if err := re.WriteFiles(); err != nil {
			t.Fatal(err)
		}
		return c.st.TransitionLeases(ctx, "sba", sandbox.Running, sandbox.Event{Actor: "alice"}, func(x *sandbox.Sandbox) error {
			re.SetRow(x)
			return nil
		}, re.Rows())
	}

	// Overtaken: a change in between (here another granted secret's first
	// lease) makes the folded commit a Conflict, with nothing written.
	stale, err := s.PlanReissue(ctx, get(), "alice")
	if err != nil || stale == nil {
		t.Fatalf("PlanReissue = %v, %v", stale, err)
	}
	if _, err := c.st.UpdateSandbox(ctx, "sba", func(x *sandbox.Sandbox) error {
		x.Net.Secrets = append(x.Net.Secrets, sandbox.SecretGrant{Name: "OTHER", Placeholder: "berth-secret-OTHER-sba"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProxyLeases(ctx, get()); err != nil {
		t.Fatal(err)
	}
	if _, err := commit(stale); !errs.Is(err, errs.Conflict) {
		t.Fatalf("overtaken plan committed: %v, want Conflict", err)
	}
	if sb := get(); sb.State != sandbox.Resuming || sb.Env["TOKEN"] != first[0].Placeholder {
		t.Errorf("after the refused commit: %s env %v", sb.State, sb.Env)
	}

	re, err := s.PlanReissue(ctx, get(), "alice")
	if err != nil || re == nil {
		t.Fatalf("PlanReissue = %v, %v", re, err)
	}
	out, err := commit(re)
	if err != nil {
		t.Fatalf("TransitionLeases: %v", err)
	}
	if err := re.Committed(ctx, out); err != nil {
		t.Fatal(err)
	}
	ls, _ := s.List(ctx, "", "sba")
	cur := Current(ls, c.now)
	if len(ls) != 4 || len(cur) != 2 || Generation(ls) != 2 {
		t.Fatalf("leases after the folded resume: %+v", ls)
	}
	for _, l := range ls {
		if (l.Generation == 2) != (l.State == store.LeaseActive) || (l.Generation == 1 && l.Reason != ReasonResumed) {
			t.Errorf("lease %s gen %d is %s/%s", l.ID, l.Generation, l.State, l.Reason)
		}
	}
	if sb := get(); sb.State != sandbox.Running || sb.Env["TOKEN"] != cur["TOKEN"] || sb.Env["OTHER"] != cur["OTHER"] || sb.Net.Secrets[0].Placeholder != cur["TOKEN"] {
		t.Errorf("sandbox after the folded resume: %s env %v grants %v, want %v", sb.State, sb.Env, sb.Net.Secrets, cur)
	}
	if want := EnvFile(cur); c.files["sba"] != string(want) {
		t.Errorf("leases.env = %q, want %q", c.files["sba"], want)
	}
	// The proxy gets the new generation active and the old one revoked
	// (to log its use), without reading them again.
	px := c.proxied["sba"]
	if len(px) != 4 || px[0].State != store.LeaseActive || px[1].State != store.LeaseActive || px[3].State != store.LeaseRevoked || px[0].Generation != 2 {
		t.Errorf("proxy leases: %+v", px)
	}
	n := len(audit.actions)
	if n < 4 {
		t.Errorf("audit: %v, want two issues and two revocations", audit.actions)
	}
	// The resumed hook then has nothing left to do.
	if err := s.OnState(ctx, statehook.Event{Phase: statehook.Resumed, Sandbox: out, Actor: "alice", LeasesReissued: true}); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.List(ctx, "", "sba"); len(again) != 4 || len(audit.actions) != n {
		t.Errorf("the hook reissued again: %+v", again)
	}
}
