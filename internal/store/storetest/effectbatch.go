package storetest

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance case for WriteEffects, the ledger's group commit. The entry
// point is TestStore in store_suite.go.

func suiteEffectBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("ebs", "alice", suiteEpoch))
	mk := func(id string) *store.Effect {
		return &store.Effect{ID: id, Lineage: "ebs", SandboxID: "ebs", Owner: "alice", Method: "POST", Host: "api.test",
			Path: "/p", BodySHA256: "ab", Identity: "i-" + id, StartedAt: suiteEpoch.Add(time.Second)}
	}
	if _, err := s.RecordEffect(ctx, *mk("eb0")); err != nil {
		t.Fatal(err)
	}
	done := store.EffectOutcome{State: store.EffectCompleted, Status: 200, RespSize: 2, EndedAt: suiteEpoch.Add(2 * time.Second), Replay: []byte("ok")}
	lost := store.EffectOutcome{State: store.EffectUnknown, Reason: "broke", EndedAt: suiteEpoch.Add(2 * time.Second)}
	ws := []store.EffectWrite{
		{Record: mk("eb1")},
		{ID: "eb0", Finish: &done},
		{Record: mk("eb0")},                // a duplicate id: its own error, the rest applies
		{ID: "eb1", Finish: &lost},         // an intent and its outcome in the same batch, in order
		{ID: "nope", Finish: &done},        // nothing pending with that id
		{Record: &store.Effect{ID: "eb3"}}, // no sandbox
		{ID: "eb2", Finish: &store.EffectOutcome{State: "bogus"}},
		{Record: mk("eb2")},
		{},
		{Record: mk("eb4")},
		{ID: "eb4", Finish: &store.EffectOutcome{State: store.EffectWithdrawn, Reason: "not sent", EndedAt: suiteEpoch.Add(2 * time.Second)}},
	}
	const ok = errs.Kind(-1)
	res, err := s.WriteEffects(ctx, ws)
	if err != nil || len(res) != len(ws) {
		t.Fatalf("WriteEffects = %v, %v; want one result per write", res, err)
	}
	for i, want := range []errs.Kind{ok, ok, errs.AlreadyExists, ok, errs.NotFound, errs.InvalidArgument, errs.InvalidArgument, ok, errs.InvalidArgument, ok, ok} {
		if want == ok && res[i] != nil || want != ok && !errs.Is(res[i], want) {
			t.Errorf("write %d: %v, want %q", i, res[i], want)
		}
	}
	if ws[0].Record.Seq == 0 || ws[7].Record.Seq <= ws[0].Record.Seq {
		t.Errorf("seqs %d, %d: want assigned in order", ws[0].Record.Seq, ws[7].Record.Seq)
	}
	for id, want := range map[string]string{"eb0": store.EffectCompleted, "eb1": store.EffectUnknown, "eb2": store.EffectPending, "eb4": store.EffectWithdrawn} {
		if e, err := s.GetEffect(ctx, id); err != nil || e.State != want {
			t.Errorf("GetEffect(%s) = %+v, %v; want %s", id, e, err, want)
		}
	}
	if e, _ := s.GetEffect(ctx, "eb0"); string(e.Replay) != "ok" || e.Status != 200 {
		t.Errorf("eb0 = %+v, want its outcome", e)
	}
	if _, err := s.GetEffect(ctx, "eb3"); !errs.Is(err, errs.NotFound) {
		t.Errorf("an invalid intent was stored: %v", err)
	}
	if res, err := s.WriteEffects(ctx, nil); err != nil || len(res) != 0 {
		t.Errorf("WriteEffects(nil) = %v, %v", res, err)
	}
}
