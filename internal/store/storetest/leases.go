package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for credential leases. The entry point is TestStore in
// store_suite.go.

func suiteLeases(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sba", "alice", suiteEpoch), suiteSandbox("sbb", "bob", suiteEpoch))
	mk := func(id, sb, owner string, gen int, ph string, at time.Time) store.Lease {
		return store.Lease{ID: id, SandboxID: sb, Owner: owner, Generation: gen, Secret: "TOKEN", Host: "api.test",
			Header: "Authorization", Placeholder: ph, IssuedAt: at, State: store.LeaseActive, ChangedAt: at}
	}
	l1 := mk("la1", "sba", "alice", 1, "ph-a1", suiteEpoch)
	l1.ExpiresAt = suiteEpoch.Add(time.Hour)
	l2 := mk("lb1", "sbb", "bob", 1, "ph-b1", suiteEpoch.Add(time.Second))
	if err := s.ApplyLeases(ctx, "sba", nil, []store.Lease{l1}, nil); err != nil {
		t.Fatalf("ApplyLeases(issue la1): %v", err)
	}
	if err := s.ApplyLeases(ctx, "sbb", nil, []store.Lease{l2}, nil); err != nil {
		t.Fatalf("ApplyLeases(issue lb1): %v", err)
	}
	if g, err := s.GetLease(ctx, "la1"); err != nil || cmp.Diff(l1, g, suiteOpts) != "" {
		t.Errorf("GetLease(la1) = %+v, %v; want %+v (%s)", g, err, l1, cmp.Diff(l1, g, suiteOpts))
	}

	// Freeze, then supersede: revoke generation 1 and issue 2 in one go.
	frozeAt := suiteEpoch.Add(time.Minute)
	if err := s.ApplyLeases(ctx, "sba", []store.LeaseUpdate{{ID: "la1", State: store.LeaseFrozen, Reason: "paused", At: frozeAt}}, nil, nil); err != nil {
		t.Fatalf("freeze: %v", err)
	}
	l3 := mk("la2", "sba", "alice", 2, "ph-a2", suiteEpoch.Add(2*time.Minute))
	// The sandbox's row changes in the same transaction.
	v0, _ := s.GetSandbox(ctx, "sba")
	if err := s.ApplyLeases(ctx, "sba", []store.LeaseUpdate{{ID: "la1", State: store.LeaseRevoked, Reason: "resumed", At: l3.IssuedAt}}, []store.Lease{l3},
		func(sb *sandbox.Sandbox) bool { sb.Env = map[string]string{"TOKEN": "ph-a2"}; return true }); err != nil {
		t.Fatalf("supersede: %v", err)
	}
	if v1, _ := s.GetSandbox(ctx, "sba"); v1.Env["TOKEN"] != "ph-a2" || v1.Version != v0.Version+1 {
		t.Errorf("sandbox after ApplyLeases: env %v version %d (was %d)", v1.Env, v1.Version, v0.Version)
	}
	if err := s.ApplyLeases(ctx, "sba", nil, nil, func(sb *sandbox.Sandbox) bool { return false }); err != nil {
		t.Errorf("ApplyLeases changing nothing: %v", err)
	}
	if v2, _ := s.GetSandbox(ctx, "sba"); v2.Version != v0.Version+1 {
		t.Errorf("a sandbox fn returning false wrote the row (version %d)", v2.Version)
	}
	want1 := l1
	want1.State, want1.Reason, want1.ChangedAt = store.LeaseRevoked, "resumed", l3.IssuedAt
	if list, err := s.ListLeases(ctx, store.LeaseFilter{SandboxID: "sba"}); err != nil || cmp.Diff([]store.Lease{want1, l3}, list, suiteOpts) != "" {
		t.Errorf("ListLeases(sba) (-want +got):\n%s (err %v)", cmp.Diff([]store.Lease{want1, l3}, list, suiteOpts), err)
	}
	if list, err := s.ListLeases(ctx, store.LeaseFilter{Owner: "bob"}); err != nil || len(list) != 1 || list[0].ID != "lb1" {
		t.Errorf("ListLeases(owner bob) = %+v, %v", list, err)
	}
	if list, err := s.ListLeases(ctx, store.LeaseFilter{Placeholder: "ph-a2"}); err != nil || len(list) != 1 || list[0].ID != "la2" {
		t.Errorf("ListLeases(placeholder ph-a2) = %+v, %v", list, err)
	}
	if list, err := s.ListLeases(ctx, store.LeaseFilter{}); err != nil || len(list) != 3 {
		t.Errorf("ListLeases(all) = %d, %v; want 3", len(list), err)
	}

	// Revoked is final; a second revoke keeps the first reason.
	for _, tc := range []struct {
		name string
		sb   string
		set  []store.LeaseUpdate
		add  []store.Lease
		kind errs.Kind
	}{
		{"revoked never thaws", "sba", []store.LeaseUpdate{{ID: "la1", State: store.LeaseActive}}, nil, errs.FailedPrecondition},
		{"another sandbox's lease", "sba", []store.LeaseUpdate{{ID: "lb1", State: store.LeaseRevoked}}, nil, errs.NotFound},
		{"unknown lease", "sba", []store.LeaseUpdate{{ID: "nope", State: store.LeaseRevoked}}, nil, errs.NotFound},
		{"bad state", "sba", []store.LeaseUpdate{{ID: "la2", State: "paused"}}, nil, errs.InvalidArgument},
		{"duplicate placeholder", "sba", nil, []store.Lease{mk("la3", "sba", "alice", 3, "ph-b1", suiteEpoch)}, errs.AlreadyExists},
		{"duplicate id", "sba", nil, []store.Lease{mk("la2", "sba", "alice", 3, "ph-new", suiteEpoch)}, errs.AlreadyExists},
		{"lease of another sandbox", "sba", nil, []store.Lease{mk("la4", "sbb", "alice", 3, "ph-x", suiteEpoch)}, errs.InvalidArgument},
		// A failing insert rolls the update before it back.
		{"all or nothing", "sba", []store.LeaseUpdate{{ID: "la2", State: store.LeaseFrozen}}, []store.Lease{mk("la5", "sba", "alice", 3, "ph-a2", suiteEpoch)}, errs.AlreadyExists},
	} {
		if err := s.ApplyLeases(ctx, tc.sb, tc.set, tc.add, func(sb *sandbox.Sandbox) bool { sb.Env = map[string]string{"X": "1"}; return true }); !errs.Is(err, tc.kind) {
			t.Errorf("%s: ApplyLeases = %v, want %v", tc.name, err, tc.kind)
		}
	}
	if g, _ := s.GetLease(ctx, "la2"); g.State != store.LeaseActive {
		t.Errorf("la2 after a failed ApplyLeases is %s, want active (rolled back)", g.State)
	}
	if sb, _ := s.GetSandbox(ctx, "sba"); sb.Env["X"] != "" {
		t.Errorf("a failed ApplyLeases changed the sandbox: %v", sb.Env)
	}
	if err := s.ApplyLeases(ctx, "sba", []store.LeaseUpdate{{ID: "la1", State: store.LeaseRevoked, Reason: "again"}}, nil, nil); err != nil {
		t.Errorf("revoking a revoked lease: %v", err)
	}
	if g, _ := s.GetLease(ctx, "la1"); g.Reason != "resumed" {
		t.Errorf("la1 reason = %q, want the first revocation's (resumed)", g.Reason)
	}
	if _, err := s.GetLease(ctx, "nope"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetLease(nope) = %v, want NotFound", err)
	}

	// Deleting a sandbox deletes its leases, and only its.
	if err := s.DeleteSandbox(ctx, "sba"); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListLeases(ctx, store.LeaseFilter{SandboxID: "sba"}); err != nil || len(list) != 0 {
		t.Errorf("leases of a deleted sandbox: %+v, %v", list, err)
	}
	if _, err := s.GetLease(ctx, "lb1"); err != nil {
		t.Errorf("another sandbox's lease went with it: %v", err)
	}
}

// suiteTransitionLeases: a transition and a lease change in one commit
// (a resume reissuing its leases), all or nothing.
func suiteTransitionLeases(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sba", "alice", suiteEpoch))
	old := store.Lease{ID: "la1", SandboxID: "sba", Owner: "alice", Generation: 1, Secret: "TOKEN", Host: "api.test",
		Header: "Authorization", Placeholder: "ph-a1", IssuedAt: suiteEpoch, State: store.LeaseActive, ChangedAt: suiteEpoch}
	if err := s.ApplyLeases(ctx, "sba", nil, []store.Lease{old}, nil); err != nil {
		t.Fatal(err)
	}
	next := old
	next.ID, next.Generation, next.Placeholder, next.IssuedAt, next.ChangedAt = "la2", 2, "ph-a2", suiteEpoch.Add(time.Second), suiteEpoch.Add(time.Second)
	ch := store.LeaseChange{Set: []store.LeaseUpdate{{ID: "la1", State: store.LeaseRevoked, Reason: "resumed", At: next.IssuedAt}}, Issue: []store.Lease{next}, Seen: 1}
	setEnv := func(sb *sandbox.Sandbox) error { sb.Env = map[string]string{"TOKEN": "ph-a2"}; return nil }
	unchanged := func(name string) {
		t.Helper()
		if ls, _ := s.ListLeases(ctx, store.LeaseFilter{SandboxID: "sba"}); len(ls) != 1 || ls[0].State != store.LeaseActive {
			t.Errorf("%s: leases %+v, want la1 alone and active", name, ls)
		}
		if sb, _ := s.GetSandbox(ctx, "sba"); sb.State != sandbox.Creating || sb.Env["TOKEN"] != "" {
			t.Errorf("%s: sandbox %s env %v, want creating and unchanged", name, sb.State, sb.Env)
		}
	}
	// An illegal move writes no lease; a lease change that fails (or was
	// planned from a read since overtaken) writes no state.
	var te *sandbox.TransitionError
	if _, err := s.TransitionLeases(ctx, "sba", sandbox.Paused, sandbox.Event{Actor: "x"}, setEnv, ch); !errors.As(err, &te) {
		t.Errorf("illegal move: %v, want a TransitionError", err)
	}
	unchanged("illegal move")
	stale := ch
	stale.Seen = 0
	if _, err := s.TransitionLeases(ctx, "sba", sandbox.Running, sandbox.Event{Actor: "x"}, setEnv, stale); !errs.Is(err, errs.Conflict) {
		t.Errorf("planned from a stale read: %v, want Conflict", err)
	}
	unchanged("stale plan")
	taken := ch
	taken.Issue = []store.Lease{next}
	taken.Issue[0].Placeholder = "ph-a1"
	if _, err := s.TransitionLeases(ctx, "sba", sandbox.Running, sandbox.Event{Actor: "x"}, setEnv, taken); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("placeholder taken: %v, want AlreadyExists", err)
	}
	unchanged("placeholder taken")

	out, err := s.TransitionLeases(ctx, "sba", sandbox.Running, sandbox.Event{Actor: "alice", Reason: "resumed"}, setEnv, ch)
	if err != nil {
		t.Fatalf("TransitionLeases: %v", err)
	}
	if out.State != sandbox.Running || out.Env["TOKEN"] != "ph-a2" {
		t.Errorf("returned sandbox %s env %v", out.State, out.Env)
	}
	if sb, _ := s.GetSandbox(ctx, "sba"); sb.State != sandbox.Running || sb.Env["TOKEN"] != "ph-a2" || sb.Version != out.Version {
		t.Errorf("stored sandbox %s env %v version %d (returned %d)", sb.State, sb.Env, sb.Version, out.Version)
	}
	got := map[string]string{}
	ls, _ := s.ListLeases(ctx, store.LeaseFilter{SandboxID: "sba"})
	for _, l := range ls {
		got[l.ID] = l.State + "/" + l.Reason
	}
	if diff := cmp.Diff(map[string]string{"la1": "revoked/resumed", "la2": "active/"}, got); diff != "" {
		t.Errorf("leases after TransitionLeases (-want +got):\n%s", diff)
	}
	if evs, _ := s.ListEvents(ctx, store.EventFilter{SandboxID: "sba"}); len(evs) != 1 || evs[0].To != sandbox.Running || evs[0].Actor != "alice" {
		t.Errorf("events: %+v, want the one transition", evs)
	}
}
