package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for the side-effect ledger. The entry point is TestStore
// in store_suite.go.

func suiteEffects(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("efa", "alice", suiteEpoch))
	mk := func(id, sb, lineage, key, identity string, at time.Duration) store.Effect {
		return store.Effect{ID: id, Lineage: lineage, SandboxID: sb, Owner: "alice", Step: "s1", Method: "POST", Host: "api.test",
			Path: "/x?y=1", BodySHA256: "ab", BodySize: 3, Key: key, KeySource: "agent", Identity: identity,
			StartedAt: suiteEpoch.Add(at)}
	}
	e1, err := s.RecordEffect(ctx, mk("ef1", "efa", "efa", "k1", "i1", time.Second))
	if err != nil || e1.Seq == 0 || e1.State != store.EffectPending {
		t.Fatalf("RecordEffect = %+v, %v; want a pending effect with a seq", e1, err)
	}
	e2, err := s.RecordEffect(ctx, mk("ef2", "efb", "efa", "", "i1", 2*time.Second))
	if err != nil || e2.Seq <= e1.Seq {
		t.Fatalf("RecordEffect(ef2) = %+v, %v", e2, err)
	}
	if _, err := s.RecordEffect(ctx, mk("ef1", "efa", "efa", "", "", 0)); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("duplicate id: %v, want AlreadyExists", err)
	}
	if _, err := s.RecordEffect(ctx, mk("ef9", "", "efa", "", "", 0)); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("no sandbox: %v, want InvalidArgument", err)
	}
	out := store.EffectOutcome{State: store.EffectCompleted, Status: 201, RespSize: 5, EndedAt: suiteEpoch.Add(3 * time.Second), Replay: []byte("r")}
	if err := s.FinishEffect(ctx, "ef1", out); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishEffect(ctx, "ef1", out); !errs.Is(err, errs.NotFound) {
		t.Errorf("finishing a finished effect: %v, want NotFound (an outcome is written once)", err)
	}
	if err := s.FinishEffect(ctx, "ef2", store.EffectOutcome{State: "bogus"}); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("bad state: %v, want InvalidArgument", err)
	}
	want := e1
	want.State, want.Status, want.RespSize, want.EndedAt, want.Replay = store.EffectCompleted, 201, 5, out.EndedAt, []byte("r")
	if g, err := s.GetEffect(ctx, "ef1"); err != nil || cmp.Diff(want, g, suiteOpts) != "" {
		t.Errorf("GetEffect(ef1) (-want +got):\n%s (%v)", cmp.Diff(want, g, suiteOpts), err)
	}
	if _, err := s.GetEffect(ctx, "nope"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetEffect(nope): %v, want NotFound", err)
	}
	listed := want
	listed.Replay = nil
	if got, err := s.FindEffects(ctx, "efa", "k1", "", 0); err != nil || cmp.Diff([]store.Effect{listed}, got, suiteOpts) != "" {
		t.Errorf("FindEffects by key = %+v, %v", got, err)
	}
	if got, err := s.FindEffects(ctx, "other", "k1", "", 0); err != nil || len(got) != 0 {
		t.Errorf("FindEffects in another lineage = %+v, %v; want none", got, err)
	}
	if got, err := s.FindEffects(ctx, "efa", "", "i1", 0); err != nil || len(got) != 2 || got[0].ID != "ef2" {
		t.Errorf("FindEffects by identity = %+v, %v; want ef2 then ef1", got, err)
	}
	if got, err := s.ListEffects(ctx, store.EffectFilter{SandboxID: "efa"}); err != nil || len(got) != 1 || got[0].ID != "ef1" {
		t.Errorf("ListEffects(efa) = %+v, %v", got, err)
	}
	if got, err := s.ListEffects(ctx, store.EffectFilter{SandboxID: "efa", Since: suiteEpoch.Add(time.Second)}); err != nil || len(got) != 0 {
		t.Errorf("ListEffects since its start = %+v, %v; want none (Since is exclusive)", got, err)
	}
	if got, err := s.ListEffects(ctx, store.EffectFilter{SandboxID: "efa", Until: suiteEpoch.Add(time.Second)}); err != nil || len(got) != 1 {
		t.Errorf("ListEffects until its start = %+v, %v; want it (Until is inclusive)", got, err)
	}
	if n, b, err := s.CountEffects(ctx, "efa"); err != nil || n != 1 || b != 1 {
		t.Errorf("CountEffects = %d, %d, %v; want 1, 1", n, b, err)
	}
	if _, err := s.GetEffectScope(ctx, "efb"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetEffectScope before any: %v, want NotFound", err)
	}
	sc := store.EffectScope{SandboxID: "efb", Lineage: "efa", Parent: "efa", PointAt: suiteEpoch,
		Windows: []store.RestoreWindow{{PointAt: suiteEpoch, At: suiteEpoch.Add(time.Hour)}}}
	if err := s.PutEffectScope(ctx, sc); err != nil {
		t.Fatal(err)
	}
	sc.Windows = append(sc.Windows, store.RestoreWindow{PointAt: suiteEpoch.Add(time.Minute), At: suiteEpoch.Add(2 * time.Hour)})
	if err := s.PutEffectScope(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if g, err := s.GetEffectScope(ctx, "efb"); err != nil || cmp.Diff(sc, g, suiteOpts) != "" {
		t.Errorf("GetEffectScope (-want +got):\n%s (%v)", cmp.Diff(sc, g, suiteOpts), err)
	}
	// Deleting a sandbox keeps its effects: a descendant's retry must find them.
	if err := s.DeleteSandbox(ctx, "efa"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetEffect(ctx, "ef1"); err != nil {
		t.Errorf("effect gone with its sandbox: %v", err)
	}
}
