package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for snapshots. The entry point is TestStore in store_suite.go.

func suiteSnapshots(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := store.Snapshot{ID: "snap1", Owner: "alice", Name: "base", SourceSandbox: "sb1", Template: "tiny",
		TemplateID: "fp1", Runtime: "runc", Layers: []string{"l2", "l1"}, CreatedAt: suiteEpoch,
		Extra: map[string]string{"k": "v"}}
	b := store.Snapshot{ID: "snap2", Owner: "bob", SourceSandbox: "sb2", Template: "tiny", Runtime: "runsc",
		Layers: []string{"l3"}, MemoryPath: "/x/memory", CreatedAt: suiteEpoch.Add(time.Second)}
	c := store.Snapshot{ID: "snap3", Owner: "alice", SourceSandbox: "sb1", Layers: []string{"l4"}, CreatedAt: suiteEpoch.Add(2 * time.Second)}
	for _, sn := range []store.Snapshot{a, b, c} {
		if err := s.CreateSnapshot(ctx, sn); err != nil {
			t.Fatalf("CreateSnapshot(%s): %v", sn.ID, err)
		}
	}
	got, err := s.GetSnapshot(ctx, "snap1")
	if err != nil {
		t.Fatalf("GetSnapshot: %v", err)
	}
	if d := cmp.Diff(a, got, suiteOpts); d != "" {
		t.Errorf("GetSnapshot (-want +got):\n%s", d)
	}
	list, err := s.ListSnapshots(ctx, "alice")
	if err != nil {
		t.Fatalf("ListSnapshots: %v", err)
	}
	if d := cmp.Diff([]store.Snapshot{a, c}, list, suiteOpts); d != "" {
		t.Errorf("ListSnapshots(alice) (-want +got):\n%s", d)
	}
	all, err := s.ListSnapshots(ctx, "")
	if err != nil || len(all) != 3 {
		t.Errorf("ListSnapshots(all) = %d, %v; want 3", len(all), err)
	}
	for _, tc := range []struct {
		name string
		sn   store.Snapshot
		kind errs.Kind
	}{
		{"duplicate id", store.Snapshot{ID: "snap1", Owner: "zed", Layers: []string{"x"}}, errs.AlreadyExists},
		{"duplicate name of owner", store.Snapshot{ID: "snap9", Owner: "alice", Name: "base", Layers: []string{"x"}}, errs.AlreadyExists},
		{"bad id", store.Snapshot{ID: "Bad-ID", Owner: "alice", Layers: []string{"x"}}, errs.InvalidArgument},
		{"no layers", store.Snapshot{ID: "snap8", Owner: "alice"}, errs.InvalidArgument},
		{"no owner", store.Snapshot{ID: "snap7", Layers: []string{"x"}}, errs.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.CreateSnapshot(ctx, tc.sn); errs.KindOf(err) != tc.kind {
				t.Errorf("CreateSnapshot = %v, want kind %v", err, tc.kind)
			}
		})
	}
	// The same name under another owner is fine.
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "snap4", Owner: "bob", Name: "base", Layers: []string{"x"}}); err != nil {
		t.Errorf("same name, other owner: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "snap1"); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "snap1"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetSnapshot after delete = %v, want NotFound", err)
	}
	if err := s.DeleteSnapshot(ctx, "snap1"); !errs.Is(err, errs.NotFound) {
		t.Errorf("DeleteSnapshot twice = %v, want NotFound", err)
	}
}
