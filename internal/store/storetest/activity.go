package storetest

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// suiteActivity: recorded entries, the events and egress entries that join
// a sandbox's timeline by themselves, the kind filter, pruning, and
// deletion with the sandbox.
func suiteActivity(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("a", "alice", suiteEpoch), suiteSandbox("b", "bob", suiteEpoch))
	if _, err := s.Transition(ctx, "a", sandbox.Running, sandbox.Event{Time: suiteEpoch, Actor: "alice", Reason: "created"}, nil); err != nil {
		t.Fatal(err)
	}
	rec := []store.ActivityEntry{
		{SandboxID: "a", Time: suiteEpoch.Add(time.Second), Kind: "exec", Actor: "alice", Summary: "true", Data: []byte(`{"pid":7}`)},
		{SandboxID: "b", Time: suiteEpoch.Add(time.Second), Kind: "exec", Actor: "bob", Summary: "b's"},
		{SandboxID: "gone", Time: suiteEpoch.Add(time.Second), Kind: "exec", Summary: "no such sandbox: dropped"},
	}
	if err := s.AppendActivity(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEgress(ctx, []store.EgressEntry{{SandboxID: "a", Owner: "alice", Time: suiteEpoch.Add(2 * time.Second),
		Proto: "tcp", DstIP: "203.0.113.1", DstPort: 443, Host: "x.test", Verdict: "deny", Rule: "default-deny", BytesOut: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, "a", sandbox.Pausing, sandbox.Event{Time: suiteEpoch.Add(3 * time.Second), Actor: "alice"},
		func(sb *sandbox.Sandbox) error { sb.PauseRequested = sandbox.PauseMemory; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, "a", sandbox.Paused, sandbox.Event{Time: suiteEpoch.Add(4 * time.Second), Actor: "alice"},
		func(sb *sandbox.Sandbox) error { sb.PauseActual = sandbox.PauseDisk; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "a", Owner: "alice", Time: suiteEpoch.Add(5 * time.Second),
		Actor: "reaper", Type: "reaper", Reason: "idle", Data: map[string]string{"cpu": "0"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendActivity(ctx, []store.ActivityEntry{{Kind: "exec"}}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("AppendActivity without sandbox id: err = %v, want InvalidArgument", err)
	}
	got, err := s.ListActivity(ctx, store.ActivityFilter{SandboxID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for i, e := range got {
		kinds = append(kinds, e.Kind)
		if i > 0 && got[i-1].Seq >= e.Seq {
			t.Errorf("entries not in seq order: %d then %d", got[i-1].Seq, e.Seq)
		}
	}
	want := []string{"lifecycle", "exec", "egress", "lifecycle", "pause", "reaper"}
	if len(kinds) != len(want) {
		t.Fatalf("kinds = %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("kinds = %v, want %v", kinds, want)
		}
	}
	if e := got[0]; e.Event == nil || e.Event.To != sandbox.Running || e.Event.Reason != "created" || !e.Time.Equal(suiteEpoch) {
		t.Errorf("lifecycle entry = %+v (event %+v), want the created transition", e, e.Event)
	}
	if e := got[1]; string(e.Data) != `{"pid":7}` || e.Summary != "true" || e.Actor != "alice" || !e.Time.Equal(suiteEpoch.Add(time.Second)) {
		t.Errorf("recorded entry = %+v", e)
	}
	if e := got[2]; e.Egress == nil || e.Egress.Host != "x.test" || e.Egress.Verdict != "deny" || e.Egress.BytesOut != 5 || e.Egress.DstPort != 443 {
		t.Errorf("egress entry = %+v (egress %+v)", e, e.Egress)
	}
	if e := got[4]; e.Event == nil || e.Event.To != sandbox.Paused ||
		string(e.Data) != `{"requested":"memory","mode":"disk","resumed_from":"","restore_count":0}` {
		t.Errorf("pause entry = %+v data %s, want the modes of the sandbox at that moment", e, e.Data)
	}
	if e := got[5]; e.Event == nil || e.Event.Data["cpu"] != "0" || e.Actor != "reaper" {
		t.Errorf("reaper entry = %+v", e)
	}
	only, err := s.ListActivity(ctx, store.ActivityFilter{SandboxID: "a", Kinds: []string{"exec", "egress"}, AfterSeq: got[0].Seq, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(only) != 1 || only[0].Kind != "exec" {
		t.Errorf("kind filter + after + limit = %+v, want the exec", only)
	}
	if _, err := s.ListActivity(ctx, store.ActivityFilter{}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("ListActivity without sandbox: err = %v, want InvalidArgument", err)
	}

	ids, last, err := s.ActivityTouched(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids["a"] != 6 || ids["b"] != 1 || last != got[5].Seq {
		t.Errorf("ActivityTouched(0) = %v, %d; want a and b up to %d", ids, last, got[5].Seq)
	}
	if ids, l, err := s.ActivityTouched(ctx, last); err != nil || len(ids) != 0 || l != last {
		t.Errorf("ActivityTouched(last) = %v, %d, %v; want none", ids, l, err)
	}

	n, err := s.PruneActivity(ctx, "a", 2)
	if err != nil || n != 4 {
		t.Fatalf("PruneActivity(a, 2) = %d, %v; want 4 deleted", n, err)
	}
	kept, err := s.ListActivity(ctx, store.ActivityFilter{SandboxID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || kept[0].Kind != "pause" || kept[1].Kind != "reaper" {
		t.Errorf("after pruning to 2: %+v, want the newest two", kept)
	}
	if n, err := s.PruneActivity(ctx, "a", 2); err != nil || n != 0 {
		t.Errorf("PruneActivity again = %d, %v; want 0", n, err)
	}
	if _, err := s.PruneActivity(ctx, "a", 0); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("PruneActivity keep 0: err = %v, want InvalidArgument", err)
	}

	// Deleting the sandbox deletes its timeline (events stay in events);
	// the other sandbox's is untouched, and late writes are dropped.
	if err := s.DeleteSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "a", Type: "note"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendActivity(ctx, rec[:1]); err != nil {
		t.Fatal(err)
	}
	if left, err := s.ListActivity(ctx, store.ActivityFilter{SandboxID: "a"}); err != nil || len(left) != 0 {
		t.Errorf("activity of a deleted sandbox = %+v, %v; want none", left, err)
	}
	if bs, err := s.ListActivity(ctx, store.ActivityFilter{SandboxID: "b"}); err != nil || len(bs) != 1 || bs[0].Summary != "b's" {
		t.Errorf("activity of b = %+v, %v; want its one entry", bs, err)
	}
}
