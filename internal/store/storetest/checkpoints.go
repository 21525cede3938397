package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for checkpoints and timeline heads. The entry point is
// TestStore in store_suite.go.

func suiteCheckpoints(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sba", "alice", suiteEpoch), suiteSandbox("sbb", "bob", suiteEpoch))
	mk := func(id, sb, owner, name string, layers ...string) store.Checkpoint {
		return store.Checkpoint{ID: id, Sandbox: sb, Owner: owner, Name: name, Layer: layers[0], Layers: layers,
			Runtime: "runc", Mode: "files", Bytes: 10, Entries: 2, CreatedAt: suiteEpoch}
	}
	c1 := mk("ck1", "sba", "alice", "one", "d1", "t1")
	c2 := mk("ck2", "sba", "alice", "", "d2", "d1", "t1")
	c2.Prev, c2.MemoryPath, c2.Mode, c2.CreatedAt = "ck1", "/x/memory", "memory", suiteEpoch.Add(time.Second)
	c3 := mk("ck3", "sbb", "bob", "one", "d3", "t1")
	var got []store.Checkpoint
	for _, c := range []store.Checkpoint{c1, c2, c3} {
		out, err := s.CreateCheckpoint(ctx, c)
		if err != nil {
			t.Fatalf("CreateCheckpoint(%s): %v", c.ID, err)
		}
		got = append(got, out)
	}
	c1.Seq, c2.Seq, c3.Seq = 1, 2, 1 // seq counts per sandbox
	if d := cmp.Diff([]store.Checkpoint{c1, c2, c3}, got, suiteOpts); d != "" {
		t.Errorf("CreateCheckpoint results (-want +got):\n%s", d)
	}
	if g, err := s.GetCheckpoint(ctx, "ck2"); err != nil || cmp.Diff(c2, g, suiteOpts) != "" {
		t.Errorf("GetCheckpoint(ck2) = %+v, %v; want %+v", g, err, c2)
	}
	if list, err := s.ListCheckpoints(ctx, "sba"); err != nil || cmp.Diff([]store.Checkpoint{c1, c2}, list, suiteOpts) != "" {
		t.Errorf("ListCheckpoints(sba) = %+v, %v", list, err)
	}
	if list, err := s.ListCheckpoints(ctx, ""); err != nil || len(list) != 3 {
		t.Errorf("ListCheckpoints(all) = %d, %v; want 3", len(list), err)
	}
	if n, err := s.CountCheckpoints(ctx, "alice"); err != nil || n != 2 {
		t.Errorf("CountCheckpoints(alice) = %d, %v; want 2", n, err)
	}
	for _, tc := range []struct {
		name string
		c    store.Checkpoint
		kind errs.Kind
	}{
		{"duplicate id", mk("ck1", "sbb", "bob", "", "x"), errs.AlreadyExists},
		{"duplicate name on the sandbox", mk("ck9", "sba", "alice", "one", "x"), errs.AlreadyExists},
		{"bad id", mk("Bad-ID", "sba", "alice", "", "x"), errs.InvalidArgument},
		{"no sandbox", mk("ck8", "", "alice", "", "x"), errs.InvalidArgument},
		{"no owner", mk("ck7", "sba", "", "", "x"), errs.InvalidArgument},
		{"view not topped by its layer", store.Checkpoint{ID: "ck6", Sandbox: "sba", Owner: "alice", Layer: "x", Layers: []string{"y"}}, errs.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.CreateCheckpoint(ctx, tc.c); errs.KindOf(err) != tc.kind {
				t.Errorf("CreateCheckpoint = %v, want kind %v", err, tc.kind)
			}
		})
	}
	if _, err := s.GetTimelineHead(ctx, "sba"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("GetTimelineHead before any = %v, want NotFound", err)
	}
	h := store.TimelineHead{Sandbox: "sba", Checkpoint: "ck1", Layers: []string{"d1", "t1"}}
	if err := s.SetTimelineHead(ctx, h); err != nil {
		t.Fatal(err)
	}
	h.Checkpoint, h.Layers = "ck2", c2.Layers
	if err := s.SetTimelineHead(ctx, h); err != nil { // replaces
		t.Fatal(err)
	}
	if g, err := s.GetTimelineHead(ctx, "sba"); err != nil || cmp.Diff(h, g, suiteOpts) != "" {
		t.Errorf("GetTimelineHead = %+v, %v; want %+v", g, err, h)
	}
	hb := store.TimelineHead{Sandbox: "sbb", Checkpoint: "ck3", Layers: c3.Layers}
	if err := s.SetTimelineHead(ctx, hb); err != nil {
		t.Fatal(err)
	}
	if hs, err := s.ListTimelineHeads(ctx); err != nil || cmp.Diff([]store.TimelineHead{h, hb}, hs, suiteOpts) != "" {
		t.Errorf("ListTimelineHeads = %+v, %v", hs, err)
	}
	if err := s.DeleteCheckpoint(ctx, "ck1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCheckpoint(ctx, "ck1"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("second DeleteCheckpoint = %v, want NotFound", err)
	}
	// The next seq never reuses a deleted one below the highest.
	c4, err := s.CreateCheckpoint(ctx, mk("ck4", "sba", "alice", "one", "d4", "t1"))
	if err != nil || c4.Seq != 3 {
		t.Errorf("CreateCheckpoint after a delete = seq %d, %v; want 3", c4.Seq, err)
	}
	// Deleting a sandbox deletes its checkpoints and head, nobody else's.
	if err := s.DeleteSandbox(ctx, "sba"); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListCheckpoints(ctx, "sba"); err != nil || len(list) != 0 {
		t.Errorf("ListCheckpoints after DeleteSandbox = %+v, %v; want none", list, err)
	}
	if _, err := s.GetTimelineHead(ctx, "sba"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("GetTimelineHead after DeleteSandbox = %v, want NotFound", err)
	}
	if list, err := s.ListCheckpoints(ctx, "sbb"); err != nil || len(list) != 1 {
		t.Errorf("ListCheckpoints(sbb) after deleting sba = %+v, %v; want 1", list, err)
	}
	if err := s.DeleteTimelineHead(ctx, "sbb"); err != nil {
		t.Errorf("DeleteTimelineHead = %v", err)
	}
}
