package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for handoff notes. The entry point is TestStore in
// store_suite.go.

func suiteNotes(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("na", "alice", suiteEpoch), suiteSandbox("nb", "bob", suiteEpoch))
	mk := func(sb, owner string, sec int, body string) store.Note {
		at := suiteEpoch.Add(time.Duration(sec) * time.Second)
		return store.Note{Sandbox: sb, Owner: owner, Trigger: "demand", CreatedAt: at, At: at, Body: []byte(body), Manifest: []byte("m" + body)}
	}
	var got []store.Note
	for i, n := range []store.Note{mk("na", "alice", 1, "a1"), mk("na", "alice", 2, "a2"), mk("nb", "bob", 1, "b1"), mk("na", "alice", 3, "a3")} {
		out, err := s.AppendNote(ctx, n, 100, 2)
		if err != nil {
			t.Fatalf("AppendNote %d: %v", i, err)
		}
		got = append(got, out)
	}
	if want := []int64{1, 2, 1, 3}; got[0].Seq != want[0] || got[1].Seq != want[1] || got[2].Seq != want[2] || got[3].Seq != want[3] {
		t.Fatalf("seqs = %d %d %d %d, want 1 2 1 3 (per sandbox)", got[0].Seq, got[1].Seq, got[2].Seq, got[3].Seq)
	}
	list, err := s.ListNotes(ctx, "na", 0)
	if err != nil || len(list) != 3 {
		t.Fatalf("ListNotes(na) = %d notes, %v; want 3", len(list), err)
	}
	if list[0].Seq != 3 || list[2].Seq != 1 {
		t.Errorf("ListNotes order = %d..%d, want newest first", list[0].Seq, list[2].Seq)
	}
	// Only the newest two keep their manifests.
	if list[2].Manifest != nil || string(list[1].Manifest) != "ma2" || string(list[0].Manifest) != "ma3" {
		t.Errorf("manifests = %q %q %q, want ma3 ma2 <nil>", list[0].Manifest, list[1].Manifest, list[2].Manifest)
	}
	want := got[1]
	if g, err := s.GetNote(ctx, "na", 2); err != nil || cmp.Diff(want, g, suiteOpts) != "" {
		t.Errorf("GetNote(na, 2) = %+v, %v; diff %s", g, err, cmp.Diff(want, g, suiteOpts))
	}
	if _, err := s.GetNote(ctx, "na", 9); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetNote(missing) = %v, want NotFound", err)
	}
	if lim, err := s.ListNotes(ctx, "na", 1); err != nil || len(lim) != 1 || lim[0].Seq != 3 {
		t.Errorf("ListNotes(na, 1) = %+v, %v", lim, err)
	}
	// NoteAt: the newest note at or before a moment, by At.
	if n, err := s.NoteAt(ctx, "na", suiteEpoch.Add(2500*time.Millisecond)); err != nil || n.Seq != 2 {
		t.Errorf("NoteAt(2.5s) = seq %d, %v; want 2", n.Seq, err)
	}
	if n, err := s.NoteAt(ctx, "na", suiteEpoch.Add(2*time.Second)); err != nil || n.Seq != 2 {
		t.Errorf("NoteAt(2s) = seq %d, %v; want 2 (at or before)", n.Seq, err)
	}
	if _, err := s.NoteAt(ctx, "na", suiteEpoch); !errs.Is(err, errs.NotFound) {
		t.Errorf("NoteAt(before all) = %v, want NotFound", err)
	}
	// Retention keeps the newest keep notes.
	if _, err := s.AppendNote(ctx, mk("na", "alice", 4, "a4"), 2, 2); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.ListNotes(ctx, "na", 0); len(list) != 2 || list[0].Seq != 4 || list[1].Seq != 3 {
		t.Errorf("after keep=2: %d notes (first seq %d), want seqs 4 3", len(list), list[0].Seq)
	}
	for _, bad := range []store.Note{{Owner: "x", Trigger: "demand"}, {Sandbox: "na", Trigger: "demand"}, {Sandbox: "na", Owner: "x"}} {
		if _, err := s.AppendNote(ctx, bad, 10, 1); !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("AppendNote(%+v) = %v, want InvalidArgument", bad, err)
		}
	}
	// Deleting a sandbox deletes its notes, not another's.
	if err := s.DeleteSandbox(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListNotes(ctx, "na", 0); err != nil || len(list) != 0 {
		t.Errorf("ListNotes after DeleteSandbox = %d, %v; want none", len(list), err)
	}
	if list, err := s.ListNotes(ctx, "nb", 0); err != nil || len(list) != 1 {
		t.Errorf("ListNotes(nb) = %d, %v; want 1", len(list), err)
	}
}
