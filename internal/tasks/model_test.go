package tasks

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }

func created(steps ...string) *Task {
	t, err := Apply(nil, Change{Task: "t", Op: OpCreate, Name: "t", Steps: steps, At: at(0), Actor: "alice"})
	if err != nil {
		panic(err)
	}
	return t
}

// TestApplyTransitions is the step and gate transition table.
func TestApplyTransitions(t *testing.T) {
	withStatus := func(st Status, attempts int) *Task {
		x := created("a", "b")
		x.Steps[0].Status, x.Steps[0].Attempts = st, attempts
		return x
	}
	gated := func(d Decision) *Task {
		x := created("a", "b")
		x.Gates = []Gate{{ID: "g1", Question: "deploy?", Step: 1, Approvers: []string{"owner"}, Decision: d}}
		return x
	}
	for _, tc := range []struct {
		name     string
		task     *Task
		ch       Change
		kind     errs.Kind // 0: applies
		field    string
		status   Status
		attempts int
	}{
		{"start pending", withStatus(Pending, 0), Change{Op: OpStepStart, Step: 1}, 0, "", Running, 1},
		{"retry failed", withStatus(Failed, 1), Change{Op: OpStepStart, Step: 1}, 0, "", Running, 2},
		{"start running", withStatus(Running, 1), Change{Op: OpStepStart, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"start done", withStatus(Done, 1), Change{Op: OpStepStart, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"start skipped", withStatus(Skipped, 0), Change{Op: OpStepStart, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"done running", withStatus(Running, 1), Change{Op: OpStepDone, Step: 1, Output: "s3://x"}, 0, "", Done, 1},
		{"done pending counts its attempt", withStatus(Pending, 0), Change{Op: OpStepDone, Step: 1}, 0, "", Done, 1},
		{"done twice", withStatus(Done, 1), Change{Op: OpStepDone, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"fail running", withStatus(Running, 2), Change{Op: OpStepFail, Step: 1}, 0, "", Failed, 2},
		{"fail failed", withStatus(Failed, 2), Change{Op: OpStepFail, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"skip pending", withStatus(Pending, 0), Change{Op: OpStepSkip, Step: 1}, 0, "", Skipped, 0},
		{"skip running", withStatus(Running, 1), Change{Op: OpStepSkip, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"attempts bounded", withStatus(Failed, MaxAttempts), Change{Op: OpStepStart, Step: 1}, errs.ResourceExhausted, "", "", 0},
		{"no step 3", withStatus(Pending, 0), Change{Op: OpStepStart, Step: 3}, errs.InvalidArgument, "step", "", 0},
		{"step 0", withStatus(Pending, 0), Change{Op: OpStepStart, Step: 0}, errs.InvalidArgument, "step", "", 0},
		{"output bounded", withStatus(Running, 1), Change{Op: OpStepDone, Step: 1, Output: string(make([]byte, MaxText+1))}, errs.InvalidArgument, "output", "", 0},
		{"gate waits", gated(Waiting), Change{Op: OpStepStart, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"gate rejected", gated(Rejected), Change{Op: OpStepStart, Step: 1}, errs.FailedPrecondition, "", "", 0},
		{"gate approved", gated(Approved), Change{Op: OpStepStart, Step: 1}, 0, "", Running, 1},
		{"unknown op", withStatus(Pending, 0), Change{Op: "explode"}, errs.InvalidArgument, "op", "", 0},
		{"no task", nil, Change{Op: OpStepStart, Step: 1}, errs.NotFound, "", "", 0},
		{"create twice", withStatus(Pending, 0), Change{Op: OpCreate, Name: "t"}, errs.AlreadyExists, "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.ch.Task, tc.ch.At = "t", at(5)
			before := tc.task.Clone()
			got, err := Apply(tc.task, tc.ch)
			if d := cmp.Diff(before, tc.task); d != "" {
				t.Errorf("Apply changed its input (-before +after):\n%s", d)
			}
			if tc.kind != 0 {
				if errs.KindOf(err) != tc.kind || (tc.field != "" && errs.FieldOf(err) != tc.field) {
					t.Fatalf("Apply = %v (kind %v, field %q), want kind %v field %q", err, errs.KindOf(err), errs.FieldOf(err), tc.kind, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			s := got.Steps[0]
			if s.Status != tc.status || s.Attempts != tc.attempts {
				t.Errorf("step = %s attempts %d, want %s attempts %d", s.Status, s.Attempts, tc.status, tc.attempts)
			}
			if !got.UpdatedAt.Equal(at(5)) {
				t.Errorf("UpdatedAt = %v, want the change's time", got.UpdatedAt)
			}
		})
	}
}

func TestCheckBounds(t *testing.T) {
	long := string(make([]byte, MaxName+1))
	many := make([]string, MaxSteps+1)
	for i := range many {
		many[i] = "s"
	}
	for _, tc := range []struct {
		name  string
		ch    Change
		field string
	}{
		{"bad id", Change{Op: OpCreate, Task: "a/b", Name: "x"}, "id"},
		{"long id", Change{Op: OpCreate, Task: long, Name: "x"}, "id"},
		{"long name", Change{Op: OpCreate, Task: "a", Name: long}, "name"},
		{"control char", Change{Op: OpCreate, Task: "a", Name: "x\x1b[2J"}, "name"},
		{"too many steps", Change{Op: OpCreate, Task: "a", Name: "x", Steps: many}, "steps"},
		{"empty step name", Change{Op: OpCreate, Task: "a", Name: "x", Steps: []string{"ok", ""}}, "steps[1]"},
		{"no question", Change{Op: OpGateAsk, Task: "a"}, "question"},
		{"bad decision", Change{Op: OpGateDone, Task: "a", Gate: "g1", Decision: "maybe"}, "decision"},
		{"too many approvers", Change{Op: OpGateAsk, Task: "a", Question: "q", Approvers: make([]string, MaxApprovers+1)}, "approvers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ch.Check()
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
				t.Errorf("Check = %v (field %q), want InvalidArgument naming %q", err, errs.FieldOf(err), tc.field)
			}
		})
	}
	// A 257th step by step_add is refused too.
	x := created(many[:MaxSteps]...)
	if _, err := Apply(x, Change{Task: "t", Op: OpStepAdd, Name: "one more"}); errs.FieldOf(err) != "steps" {
		t.Errorf("step_add past the bound = %v, want field steps", err)
	}
}

func TestGates(t *testing.T) {
	x := created("build", "deploy")
	x, err := Apply(x, Change{Task: "t", Op: OpGateAsk, Question: "ship it?", Step: 2, At: at(1), Actor: "sandbox:sb"})
	if err != nil {
		t.Fatal(err)
	}
	g := x.Gates[0]
	if g.ID != "g1" || g.Decision != Waiting || !cmp.Equal(g.Approvers, []string{"owner"}) || g.AskedBy != "sandbox:sb" {
		t.Fatalf("gate = %+v, want g1 waiting for the owner", g)
	}
	x, err = Apply(x, Change{Task: "t", Op: OpGateDone, Gate: "g1", Decision: Approved, Comment: "go", At: at(2), Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if g := x.Gates[0]; g.Decision != Approved || g.DecidedBy != "alice" || !g.DecidedAt.Equal(at(2)) || g.Comment != "go" {
		t.Errorf("decided gate = %+v", g)
	}
	if _, err := Apply(x, Change{Task: "t", Op: OpGateDone, Gate: "g1", Decision: Rejected}); errs.KindOf(err) != errs.FailedPrecondition {
		t.Errorf("deciding twice = %v, want FailedPrecondition", err)
	}
	if _, err := Apply(x, Change{Task: "t", Op: OpGateDone, Gate: "g9", Decision: Rejected}); errs.KindOf(err) != errs.NotFound {
		t.Errorf("unknown gate = %v, want NotFound", err)
	}
}

func TestMayDecide(t *testing.T) {
	g := Gate{Approvers: []string{"owner", "bob"}}
	adminOnly := Gate{Approvers: []string{"admin"}}
	for _, tc := range []struct {
		name string
		g    Gate
		c    Caller
		want bool
	}{
		{"owner", g, Caller{Owner: "alice"}, true},
		{"named owner", g, Caller{Owner: "bob"}, true},
		{"other owner", g, Caller{Owner: "carol"}, false},
		{"admin always", g, Caller{Admin: true}, true},
		{"the sandbox itself", g, Caller{Owner: "alice", Sandbox: "sb"}, false},
		{"admin-only gate, owner", adminOnly, Caller{Owner: "alice"}, false},
		{"admin-only gate, admin", adminOnly, Caller{Admin: true}, true},
		{"a key owned by someone called admin", adminOnly, Caller{Owner: "admin"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mayDecide(tc.g, tc.c, "alice"); got != tc.want {
				t.Errorf("mayDecide = %v, want %v", got, tc.want)
			}
		})
	}
}

// history is a ledger's log: task t created with 4 steps at 0, steps 1 and
// 2 done by 2 (the checkpoint is taken at 2), steps 3 and 4 done by 4, a
// second task created at 3 and a gate asked at 4.
func history() []Change {
	return []Change{
		{Task: "t", Op: OpCreate, Name: "t", Steps: []string{"fetch", "build", "test", "ship"}, At: at(0)},
		{Task: "t", Op: OpStepStart, Step: 1, At: at(1)},
		{Task: "t", Op: OpStepDone, Step: 1, At: at(1)},
		{Task: "t", Op: OpStepStart, Step: 2, At: at(2)},
		{Task: "t", Op: OpStepDone, Step: 2, Output: "bin/app", At: at(2)},
		{Task: "u", Op: OpCreate, Name: "u", Steps: []string{"x"}, At: at(3)},
		{Task: "t", Op: OpStepStart, Step: 3, At: at(3)},
		{Task: "t", Op: OpStepDone, Step: 3, At: at(3)},
		{Task: "t", Op: OpStepDone, Step: 4, At: at(4)},
		{Task: "t", Op: OpGateAsk, Question: "release?", At: at(4)},
		{Task: "t", Op: OpStepStart, Step: 9, At: at(4)}, // refused when made: skipped on replay
	}
}

func statuses(l []*Task) map[string][]Status {
	out := map[string][]Status{}
	for _, t := range l {
		for _, s := range t.Steps {
			out[t.ID] = append(out[t.ID], s.Status)
		}
	}
	return out
}

// TestRollbackAt: the ledger at any T is the replay up to T, and the diff
// of now against T names exactly what a rollback to T undoes.
func TestRollbackAt(t *testing.T) {
	h := history()
	for _, tc := range []struct {
		at   time.Time
		want map[string][]Status
	}{
		{at(0).Add(-time.Second), map[string][]Status{}},
		{at(0), map[string][]Status{"t": {Pending, Pending, Pending, Pending}}},
		{at(2), map[string][]Status{"t": {Done, Done, Pending, Pending}}},
		{at(3), map[string][]Status{"t": {Done, Done, Done, Pending}, "u": {Pending}}},
		{at(9), map[string][]Status{"t": {Done, Done, Done, Done}, "u": {Pending}}},
	} {
		if d := cmp.Diff(tc.want, statuses(At(h, tc.at))); d != "" {
			t.Errorf("At(%v) (-want +got):\n%s", tc.at.Sub(t0), d)
		}
	}
	now, then := At(h, at(9)), At(h, at(2))
	got := Diff(now, then)
	want := []Changed{
		{Task: "t", Kind: "step", Index: 3, Name: "test", Now: "done", Then: "pending"},
		{Task: "t", Kind: "step", Index: 4, Name: "ship", Now: "done", Then: "pending"},
		{Task: "t", Kind: "gate", Index: 1, Name: "g1", Now: "waiting", Then: ""},
		{Task: "u", Kind: "step", Index: 1, Name: "x", Now: "pending", Then: ""},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Diff (-want +got):\n%s", d)
	}
	rb := Rollback{Changed: got}
	if d := cmp.Diff([]string{"t/3 (test)", "t/4 (ship)", "u/1 (x)"}, rb.Steps()); d != "" {
		t.Errorf("Rollback.Steps (-want +got):\n%s", d)
	}
	if d := Diff(now, now); len(d) != 0 {
		t.Errorf("Diff of a ledger with itself = %+v, want none", d)
	}
	// A rollback is itself appended (resets): the log stays append-only,
	// and the ledger at a time after the rollback is the rolled-back one.
	h = append(h, Change{Task: "t", Op: OpReset, State: then[0], At: at(10)}, Change{Task: "u", Op: OpReset, At: at(10)})
	if d := cmp.Diff(map[string][]Status{"t": {Done, Done, Pending, Pending}}, statuses(At(h, at(11)))); d != "" {
		t.Errorf("after the rollback (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string][]Status{"t": {Done, Done, Done, Done}, "u": {Pending}}, statuses(At(h, at(9)))); d != "" {
		t.Errorf("before the rollback, still computable (-want +got):\n%s", d)
	}
	// A task re-created after its reset to nothing comes back, last.
	h = append(h, Change{Task: "u", Op: OpCreate, Name: "u2", At: at(12)})
	if l := At(h, at(12)); len(l) != 2 || l[1].ID != "u" || l[1].Name != "u2" {
		t.Errorf("re-created task: %+v", l)
	}
}

func TestSummarizeAndFork(t *testing.T) {
	h := history()
	l := At(h, at(3)) // t: done, done, done, pending; u: pending (both changed at 3: the later created wins)
	s := Summarize(l, nil)
	if s.Tasks != 2 || s.Task != "u" || s.Step != 1 || s.StepName != "x" || s.Status != Pending || len(s.Waiting) != 0 {
		t.Errorf("Summarize = %+v, want the latest open task u at step 1", s)
	}
	l = At(h, at(9))
	s = Summarize(l, nil)
	// t is complete: u (open) is current; t's gate waits.
	if s.Task != "u" || !cmp.Equal(s.Waiting, []string{"t/g1"}) {
		t.Errorf("Summarize = %+v, want u current and t/g1 waiting", s)
	}
	if got := RunningStep(l); got != "" {
		t.Errorf("RunningStep with nothing running = %q", got)
	}
	running := At(h[:4], at(9)) // step 2 of t started
	if got := RunningStep(running); got != "t/2" {
		t.Errorf("RunningStep = %q, want t/2", got)
	}
	forked := ForkCopy(At(h, at(2)), "parent1", at(2))
	if len(forked) != 1 || forked[0].Forked == nil || *forked[0].Forked != (Fork{Parent: "parent1", AtStep: 3, StepName: "test", At: at(2)}) {
		t.Fatalf("ForkCopy = %+v, want t forked from parent1 at step 3", forked[0].Forked)
	}
	if sum := Summarize(forked, nil); sum.Forked == nil || sum.Forked.AtStep != 3 {
		t.Errorf("Summarize of a fork = %+v, want the fork mark", sum)
	}
	// The copy is deep: changing the child's task leaves the parent's alone.
	parent := At(h, at(2))
	child := ForkCopy(parent, "p", at(2))
	child[0].Steps[2].Status = Done
	if parent[0].Steps[2].Status != Pending {
		t.Errorf("ForkCopy shares steps with its parent")
	}
}
