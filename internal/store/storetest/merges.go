package storetest

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for merges and their conflicts. The entry point is
// TestStore in store_suite.go.

func suiteMerges(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("parent", "alice", suiteEpoch), suiteSandbox("other", "alice", suiteEpoch))
	m := store.Merge{ID: "m1", Owner: "alice", Target: "parent", Source: "child", BaseSnapshot: "s1", SourceSnapshot: "s2",
		SourceLayer: "l2", Strategy: "three-way", State: store.MergeConflicted, Plan: []byte(`{"writes":[]}`), Result: []byte(`{}`),
		CreatedAt: suiteEpoch, UpdatedAt: suiteEpoch}
	cs := []store.MergeConflict{
		{ID: "cb", Path: "b", Kind: "content", Message: "both", Data: []byte(`{"x":1}`)},
		{ID: "ca", Path: "a", Kind: "binary", Message: "both", Data: []byte(`{"x":2}`)},
	}
	if err := s.CreateMerge(ctx, m, cs); err != nil {
		t.Fatalf("CreateMerge: %v", err)
	}
	got, err := s.GetMerge(ctx, "m1")
	if err != nil {
		t.Fatalf("GetMerge: %v", err)
	}
	if d := cmp.Diff(m, got, suiteOpts); d != "" {
		t.Errorf("GetMerge (-want +got):\n%s", d)
	}
	// One open merge per target.
	second := m
	second.ID = "m2"
	if err := s.CreateMerge(ctx, second, nil); errs.KindOf(err) != errs.AlreadyExists {
		t.Errorf("second open merge of a target = %v, want AlreadyExists", err)
	}
	other := m
	other.ID, other.Target = "m3", "other"
	if err := s.CreateMerge(ctx, other, nil); err != nil {
		t.Errorf("open merge of another target: %v", err)
	}
	if err := s.CreateMerge(ctx, store.Merge{ID: "Bad", Owner: "a", Target: "parent"}, nil); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("bad id = %v, want InvalidArgument", err)
	}
	list, err := s.ListMergeConflicts(ctx, "m1")
	if err != nil || len(list) != 2 || list[0].ID != "cb" || list[1].ID != "ca" || list[0].Seq != 0 || list[1].Seq != 1 {
		t.Fatalf("ListMergeConflicts = %+v, %v; want cb, ca in plan order", list, err)
	}
	if err := s.ResolveMergeConflict(ctx, "m1", "ca", []byte(`{"side":"ours"}`), []byte(`{"writes":[1]}`)); err != nil {
		t.Fatalf("ResolveMergeConflict: %v", err)
	}
	for _, tc := range []struct {
		name, merge, conflict string
		kind                  errs.Kind
	}{
		{"again", "m1", "ca", errs.Conflict},
		{"unknown conflict", "m1", "zz", errs.NotFound},
		{"unknown merge", "m9", "ca", errs.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.ResolveMergeConflict(ctx, tc.merge, tc.conflict, []byte(`{}`), nil); errs.KindOf(err) != tc.kind {
				t.Errorf("ResolveMergeConflict = %v, want %v", err, tc.kind)
			}
		})
	}
	list, _ = s.ListMergeConflicts(ctx, "m1")
	if string(list[1].Resolution) != `{"side":"ours"}` || len(list[0].Resolution) != 0 {
		t.Errorf("resolutions after resolve: %+v", list)
	}
	if got, _ := s.GetMerge(ctx, "m1"); string(got.Plan) != `{"writes":[1]}` {
		t.Errorf("plan after resolve = %s", got.Plan)
	}
	// Applied is final; a new merge of the target may then open.
	got.State, got.Reason = store.MergeApplied, "done"
	if err := s.UpdateMerge(ctx, got); err != nil {
		t.Fatalf("UpdateMerge: %v", err)
	}
	got.State = store.MergeAborted
	if err := s.UpdateMerge(ctx, got); errs.KindOf(err) != errs.Conflict {
		t.Errorf("UpdateMerge of an applied merge = %v, want Conflict", err)
	}
	if err := s.UpdateMerge(ctx, store.Merge{ID: "m9"}); errs.KindOf(err) != errs.NotFound {
		t.Errorf("UpdateMerge of an unknown merge = %v, want NotFound", err)
	}
	if err := s.CreateMerge(ctx, second, nil); err != nil {
		t.Errorf("new merge after the first was applied: %v", err)
	}
	all, err := s.ListMerges(ctx, "parent")
	if err != nil || len(all) != 2 || all[0].ID != "m1" || all[0].State != store.MergeApplied {
		t.Errorf("ListMerges(parent) = %+v, %v", all, err)
	}
	// Deleting the target deletes its merges and their conflicts.
	if err := s.DeleteSandbox(ctx, "parent"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if _, err := s.GetMerge(ctx, "m1"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("merge after its target was deleted: %v", err)
	}
	if list, _ := s.ListMergeConflicts(ctx, "m1"); len(list) != 0 {
		t.Errorf("conflicts after the target was deleted: %d", len(list))
	}
	if all, _ := s.ListMerges(ctx, ""); len(all) != 1 || all[0].ID != "m3" {
		t.Errorf("ListMerges(all) after delete = %+v", all)
	}
}
