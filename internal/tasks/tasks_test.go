package tasks

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// storeCore is the core over a real SQLite store, with a clock the test moves.
type storeCore struct {
	st  store.Store
	mu  sync.Mutex
	now time.Time
}

func (c *storeCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || (owner != "" && sb.Owner != owner) {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}
func (c *storeCore) Store() store.Store { return c.st }
func (c *storeCore) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

type auditLog struct{ actions []string }

func (a *auditLog) Audit(_ context.Context, actor, action, id string, _ map[string]string) {
	a.actions = append(a.actions, actor+" "+action+" "+id)
}

func newService(t *testing.T, ids ...string) (*Service, *storeCore, *auditLog) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, id := range ids {
		if err := st.CreateSandbox(t.Context(), &sandbox.Sandbox{ID: id, Owner: "alice", Template: "tiny", Runtime: "runc",
			State: sandbox.Running, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), ExpiryAction: sandbox.ExpireStop}); err != nil {
			t.Fatal(err)
		}
	}
	c := &storeCore{st: st, now: t0}
	a := &auditLog{}
	return New(c, Config{Auditor: a}), c, a
}

func TestServiceGatesAndCallers(t *testing.T) {
	ctx := t.Context()
	s, _, audit := newService(t, "sba", "sbb")
	alice := Caller{Owner: "alice", Actor: "alice"}
	inside := Caller{Owner: "alice", Sandbox: "sba", Actor: "sandbox:sba"}
	if _, err := s.Create(ctx, alice, "sba", CreateRequest{ID: "deploy", Steps: []string{"build", "ship"}}); err != nil {
		t.Fatal(err)
	}
	// From inside: its own ledger as "self", a step, a gate on step 2.
	if _, err := s.Step(ctx, inside, "self", "deploy", StepRequest{Op: OpStepStart, Step: "build"}); err != nil {
		t.Fatalf("step start from inside: %v", err)
	}
	if got := s.CurrentStep(ctx, "sba"); got != "deploy/1" {
		t.Errorf("CurrentStep = %q, want deploy/1", got)
	}
	if _, err := s.Step(ctx, inside, "self", "deploy", StepRequest{Op: OpStepDone, Step: "1", Output: "out/app"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ask(ctx, inside, "self", "deploy", AskRequest{Question: "ship?", Step: "ship"}); err != nil {
		t.Fatalf("ask from inside: %v", err)
	}
	if _, err := s.Ask(ctx, inside, "self", "deploy", AskRequest{Question: "x", Approvers: []string{"mallory"}}); errs.KindOf(err) != errs.PermissionDenied || errs.FieldOf(err) != "approvers" {
		t.Errorf("a sandbox naming its approvers = %v, want PermissionDenied on approvers", err)
	}
	if _, err := s.Step(ctx, inside, "self", "deploy", StepRequest{Op: OpStepStart, Step: "ship"}); errs.KindOf(err) != errs.FailedPrecondition {
		t.Errorf("starting a gated step = %v, want FailedPrecondition", err)
	}
	if _, err := s.Decide(ctx, inside, "self", "deploy", "g1", Approved, ""); errs.KindOf(err) != errs.PermissionDenied {
		t.Errorf("self-approval = %v, want PermissionDenied", err)
	}
	if _, err := s.List(ctx, inside, "sbb"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("a sandbox reading another's ledger = %v, want NotFound", err)
	}
	if _, err := s.Decide(ctx, Caller{Owner: "carol", Actor: "carol"}, "sba", "deploy", "g1", Approved, ""); errs.KindOf(err) != errs.NotFound {
		t.Errorf("another owner approving = %v, want NotFound", err)
	}
	if _, err := s.Decide(ctx, alice, "sba", "deploy", "g1", Approved, "ok"); err != nil {
		t.Fatalf("owner approves: %v", err)
	}
	if _, err := s.Step(ctx, inside, "self", "deploy", StepRequest{Op: OpStepStart, Step: "ship"}); err != nil {
		t.Errorf("start after approval: %v", err)
	}
	// A named approver of another owner decides that gate, and only that.
	if _, err := s.Ask(ctx, alice, "sba", "deploy", AskRequest{Question: "pay?", Approvers: []string{"bob"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, alice, "sba", "deploy", "g2", Approved, ""); errs.KindOf(err) != errs.PermissionDenied {
		t.Errorf("owner deciding a gate only bob may = %v, want PermissionDenied", err)
	}
	if _, err := s.Decide(ctx, Caller{Owner: "bob", Actor: "bob"}, "sba", "deploy", "g1", Approved, ""); errs.KindOf(err) != errs.NotFound {
		t.Errorf("bob deciding a gate he is not named on = %v, want NotFound", err)
	}
	task, err := s.Decide(ctx, Caller{Owner: "bob", Actor: "bob"}, "sba", "deploy", "g2", Rejected, "no")
	if err != nil || task.Gates[1].Decision != Rejected || task.Gates[1].DecidedBy != "bob" {
		t.Fatalf("bob rejects = %+v, %v", task, err)
	}
	for range MaxTasks - 1 {
		if _, err := s.Create(ctx, alice, "sba", CreateRequest{ID: "t" + time.Now().Format("150405.000000000")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, alice, "sba", CreateRequest{ID: "onetoomany"}); errs.FieldOf(err) != "tasks" {
		t.Errorf("task 65 = %v, want field tasks", err)
	}
	want := []string{"alice task.create sba", "sandbox:sba task.step_start sba", "sandbox:sba task.step_done sba",
		"sandbox:sba task.gate_ask sba", "alice task.approve sba", "sandbox:sba task.step_start sba",
		"alice task.gate_ask sba", "bob task.reject sba"}
	if d := cmp.Diff(want, audit.actions[:len(want)]); d != "" {
		t.Errorf("audit (-want +got):\n%s", d)
	}
}

// TestServiceForkAndRestore drives the hook as the lifecycle does.
func TestServiceForkAndRestore(t *testing.T) {
	ctx := t.Context()
	s, c, _ := newService(t, "parent", "child", "fromsnap")
	alice := Caller{Owner: "alice", Actor: "alice"}
	if _, err := s.Create(ctx, alice, "parent", CreateRequest{ID: "job", Steps: []string{"s1", "s2", "s3", "s4"}}); err != nil {
		t.Fatal(err)
	}
	done := func(id, step string) {
		t.Helper()
		if _, err := s.Step(ctx, alice, id, "job", StepRequest{Op: OpStepDone, Step: step}); err != nil {
			t.Fatal(err)
		}
	}
	done("parent", "1")
	done("parent", "2")
	point := c.Now() // the checkpoint at step 2
	done("parent", "3")
	done("parent", "4")

	bus := &statehook.Bus{}
	bus.Register("tasks", s)
	sb := func(id string) *sandbox.Sandbox { return &sandbox.Sandbox{ID: id, Owner: "alice"} }
	if err := bus.Fire(ctx, statehook.Event{Phase: statehook.Forked, Sandbox: sb("child"), From: "parent", PointAt: point}); err != nil {
		t.Fatal(err)
	}
	l, err := s.List(ctx, alice, "child")
	if err != nil || len(l.Tasks) != 1 {
		t.Fatalf("child ledger = %+v, %v", l, err)
	}
	if f := l.Tasks[0].Forked; f == nil || f.Parent != "parent" || f.AtStep != 3 {
		t.Errorf("child's fork mark = %+v, want parent at step 3", f)
	}
	if d := cmp.Diff(map[string][]Status{"job": {Done, Done, Pending, Pending}}, statuses(l.Tasks)); d != "" {
		t.Errorf("child ledger (-want +got):\n%s", d)
	}
	done("child", "3")
	if p, _ := s.Get(ctx, alice, "parent", "job"); p.Forked != nil {
		t.Errorf("parent marked as forked: %+v", p.Forked)
	}

	// Create from a snapshot taken at step 2: the new sandbox holds the
	// ledger at step 2, warned of steps 3-4.
	if err := bus.Fire(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: sb("fromsnap"), From: "parent", Snapshot: "snap1", PointAt: point}); err != nil {
		t.Fatal(err)
	}
	l, _ = s.List(ctx, alice, "fromsnap")
	if d := cmp.Diff(map[string][]Status{"job": {Done, Done, Pending, Pending}}, statuses(l.Tasks)); d != "" {
		t.Errorf("ledger from the snapshot (-want +got):\n%s", d)
	}
	if l.Rollback == nil || !cmp.Equal(l.Rollback.Steps(), []string{"job/3 (s3)", "job/4 (s4)"}) || l.Rollback.Snapshot != "snap1" {
		t.Errorf("rollback warning = %+v, want steps 3-4 of snap1", l.Rollback)
	}
	// Rewind in place: the same, and the parent's log still tells the later state.
	if err := bus.Fire(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: sb("parent"), From: "parent", Checkpoint: "cp2", PointAt: point}); err != nil {
		t.Fatal(err)
	}
	l, _ = s.List(ctx, alice, "parent")
	if d := cmp.Diff(map[string][]Status{"job": {Done, Done, Pending, Pending}}, statuses(l.Tasks)); d != "" {
		t.Errorf("rewound ledger (-want +got):\n%s", d)
	}
	if rb := s.LastRollback(ctx, "parent"); rb == nil || rb.Checkpoint != "cp2" || !cmp.Equal(rb.Steps(), []string{"job/3 (s3)", "job/4 (s4)"}) {
		t.Errorf("LastRollback = %+v", rb)
	}
	sum, err := s.Summary(ctx, "parent")
	if err != nil || sum == nil || sum.Step != 3 || sum.Rollback == nil {
		t.Errorf("Summary after rewind = %+v, %v; want step 3 and the warning", sum, err)
	}
	h, err := s.History(ctx, alice, "parent", "job")
	if err != nil || len(h) != 6 || h[5].Op != OpReset {
		t.Errorf("History = %d changes (%v), want 6 ending in a reset", len(h), err)
	}
	// The child was left alone by the parent's rewind.
	l, _ = s.List(ctx, alice, "child")
	if d := cmp.Diff(map[string][]Status{"job": {Done, Done, Done, Pending}}, statuses(l.Tasks)); d != "" {
		t.Errorf("child after the parent's rewind (-want +got):\n%s", d)
	}
}

// BenchmarkSummary: the ledger's summary (shown on GET and resume of a
// sandbox) at the bound of 64 tasks × 20 steps, 2 waiting gates each, read
// from a real SQLite store.
func BenchmarkSummary(b *testing.B) {
	st, err := store.OpenSQLite(filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.CreateSandbox(ctx, &sandbox.Sandbox{ID: "sb", Owner: "alice", Template: "tiny", Runtime: "runc",
		State: sandbox.Running, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), ExpiryAction: sandbox.ExpireStop}); err != nil {
		b.Fatal(err)
	}
	s := New(&storeCore{st: st, now: t0}, Config{})
	c := Caller{Owner: "alice", Actor: "alice"}
	steps := make([]string, 20)
	for i := range steps {
		steps[i] = "step"
	}
	for i := range MaxTasks {
		id := "t" + strconv.Itoa(i)
		if _, err := s.Create(ctx, c, "sb", CreateRequest{ID: id, Steps: steps}); err != nil {
			b.Fatal(err)
		}
		for range 2 {
			if _, err := s.Ask(ctx, c, "sb", id, AskRequest{Question: "ok?"}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if sum, err := s.Summary(ctx, "sb"); err != nil || sum.Tasks != MaxTasks {
			b.Fatal(sum, err)
		}
	}
}
