package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for the task ledger's tables. The entry point is
// TestStore in store_suite.go.

func suiteTasks(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sba", "alice", suiteEpoch), suiteSandbox("sbb", "alice", suiteEpoch))
	at := func(n int) time.Time { return suiteEpoch.Add(time.Duration(n) * time.Second) }
	ch := func(task, op string, n int) store.TaskChange {
		return store.TaskChange{Sandbox: "sba", Task: task, Time: at(n), Actor: "alice", Op: op, Data: []byte(`{"n":` + string(rune('0'+n)) + `}`)}
	}
	if err := s.WriteTasks(ctx, store.TaskWrite{Sandbox: "nosuch", Put: []store.TaskRecord{{ID: "x", State: []byte(`{}`)}}}); errs.KindOf(err) != errs.NotFound {
		t.Errorf("WriteTasks of a missing sandbox = %v, want NotFound", err)
	}
	if err := s.WriteTasks(ctx, store.TaskWrite{Sandbox: "sba", Put: []store.TaskRecord{{ID: "", State: []byte(`{}`)}}}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("WriteTasks of a task without id = %v, want InvalidArgument", err)
	}
	if got, err := s.GetTaskLedger(ctx, "sba"); err != nil || got != nil {
		t.Errorf("GetTaskLedger before any = %q, %v; want nil, nil", got, err)
	}
	steps := []store.TaskWrite{
		{Sandbox: "sba", Put: []store.TaskRecord{{ID: "build", State: []byte(`{"v":1}`), UpdatedAt: at(1)}}, Changes: []store.TaskChange{ch("build", "create", 1)}},
		{Sandbox: "sba", Put: []store.TaskRecord{{ID: "deploy", State: []byte(`{"v":1}`), UpdatedAt: at(2)}}, Changes: []store.TaskChange{ch("deploy", "create", 2)}},
		{Sandbox: "sba", Put: []store.TaskRecord{{ID: "build", State: []byte(`{"v":2}`), Brief: []byte(`{"b":2}`), UpdatedAt: at(3)}}, Changes: []store.TaskChange{ch("build", "step_start", 3)}, Ledger: []byte(`{"l":1}`)},
		{Sandbox: "sbb", Put: []store.TaskRecord{{ID: "build", State: []byte(`{"other":1}`), UpdatedAt: at(4)}}, Changes: []store.TaskChange{{Sandbox: "sbb", Task: "build", Time: at(4), Op: "create", Data: []byte(`{}`)}}},
	}
	for i, w := range steps {
		if err := s.WriteTasks(ctx, w); err != nil {
			t.Fatalf("WriteTasks #%d: %v", i, err)
		}
	}
	list, err := s.ListTasks(ctx, "sba")
	if err != nil {
		t.Fatalf("ListTasks: %v", err)
	}
	want := []store.TaskRecord{
		{Sandbox: "sba", ID: "build", Seq: 1, State: []byte(`{"v":2}`), Brief: []byte(`{"b":2}`), UpdatedAt: at(3)}, // an update keeps its number
		{Sandbox: "sba", ID: "deploy", Seq: 2, State: []byte(`{"v":1}`), UpdatedAt: at(2)},
	}
	if d := cmp.Diff(want, list, suiteOpts); d != "" {
		t.Errorf("ListTasks (-want +got):\n%s", d)
	}
	briefs, err := s.ListTaskBriefs(ctx, "sba")
	if err != nil {
		t.Fatalf("ListTaskBriefs: %v", err)
	}
	for i := range want {
		want[i].State = nil
	}
	if d := cmp.Diff(want, briefs, suiteOpts); d != "" {
		t.Errorf("ListTaskBriefs (-want +got):\n%s", d)
	}
	if got, err := s.GetTask(ctx, "sba", "deploy"); err != nil || got.Seq != 2 || string(got.State) != `{"v":1}` {
		t.Errorf("GetTask = %+v, %v", got, err)
	}
	if _, err := s.GetTask(ctx, "sba", "nosuch"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("GetTask of a missing task = %v, want NotFound", err)
	}
	if _, err := s.GetTask(ctx, "sbb", "deploy"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("GetTask of another sandbox's task = %v, want NotFound", err)
	}
	all, err := s.ListTaskChanges(ctx, "sba", "", time.Time{})
	if err != nil || len(all) != 3 || all[0].Op != "create" || all[2].Op != "step_start" || !all[2].Time.Equal(at(3)) ||
		all[0].Seq >= all[1].Seq || all[1].Seq >= all[2].Seq || string(all[1].Data) != `{"n":2}` || all[0].Actor != "alice" {
		t.Fatalf("ListTaskChanges = %+v, %v; want the 3 changes of sba in order", all, err)
	}
	if one, err := s.ListTaskChanges(ctx, "sba", "build", time.Time{}); err != nil || len(one) != 2 {
		t.Errorf("ListTaskChanges of one task = %+v, %v; want 2", one, err)
	}
	if upto, err := s.ListTaskChanges(ctx, "sba", "", at(2)); err != nil || len(upto) != 2 || upto[1].Task != "deploy" {
		t.Errorf("ListTaskChanges until t2 = %+v, %v; want the first 2 (until is inclusive)", upto, err)
	}
	if n, err := s.CountTaskChanges(ctx, "sba"); err != nil || n != 3 {
		t.Errorf("CountTaskChanges = %d, %v; want 3", n, err)
	}
	if got, err := s.GetTaskLedger(ctx, "sba"); err != nil || string(got) != `{"l":1}` {
		t.Errorf("GetTaskLedger = %q, %v", got, err)
	}
	// A delete and a re-create in one write: the re-created task is numbered last.
	if err := s.WriteTasks(ctx, store.TaskWrite{Sandbox: "sba", Delete: []string{"build"}, Ledger: []byte(`{"l":2}`)}); err != nil {
		t.Fatalf("WriteTasks delete: %v", err)
	}
	if err := s.WriteTasks(ctx, store.TaskWrite{Sandbox: "sba", Put: []store.TaskRecord{{ID: "build", State: []byte(`{"v":3}`)}}}); err != nil {
		t.Fatalf("WriteTasks re-create: %v", err)
	}
	if list, err := s.ListTasks(ctx, "sba"); err != nil || len(list) != 2 || list[0].ID != "deploy" || list[1].ID != "build" || list[1].Seq != 3 {
		t.Errorf("ListTasks after delete + re-create = %+v, %v; want deploy, build(3)", list, err)
	}
	if got, _ := s.GetTaskLedger(ctx, "sba"); string(got) != `{"l":2}` {
		t.Errorf("GetTaskLedger after replace = %q", got)
	}
	// The log is append-only: deleting a task keeps its changes.
	if n, _ := s.CountTaskChanges(ctx, "sba"); n != 3 {
		t.Errorf("CountTaskChanges after delete = %d, want 3", n)
	}
	// Deleting the sandbox deletes its ledger, and nothing of another's.
	if err := s.DeleteSandbox(ctx, "sba"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if list, err := s.ListTasks(ctx, "sba"); err != nil || len(list) != 0 {
		t.Errorf("ListTasks of a deleted sandbox = %+v, %v; want none", list, err)
	}
	if n, err := s.CountTaskChanges(ctx, "sba"); err != nil || n != 0 {
		t.Errorf("CountTaskChanges of a deleted sandbox = %d, %v; want 0", n, err)
	}
	if got, err := s.GetTaskLedger(ctx, "sba"); err != nil || got != nil {
		t.Errorf("GetTaskLedger of a deleted sandbox = %q, %v; want nil", got, err)
	}
	if list, err := s.ListTasks(ctx, "sbb"); err != nil || len(list) != 1 || string(list[0].State) != `{"other":1}` {
		t.Errorf("ListTasks of the other sandbox = %+v, %v", list, err)
	}
}
