// Package tasks owns the task ledger of each sandbox (issue 17, item 1):
// tasks with ordered steps (status, attempts, start and end, an output
// reference) and approval gates (what is asked, who may approve, the
// decision, by whom and when). The ledger lives in the store, outside the
// sandbox; every change is appended to a per-sandbox change log, so the
// ledger at any time T is the replay of the changes up to T (model.go).
// Its row of the state table (docs/STATE.md) is the statehook in hook.go:
// kept on pause, a fork's child gets a copy marked as forked at step N of
// its parent, a restore rolls the ledger back to the restored point and
// leaves a warning listing what that undid.
//
// State and locks: Service.mu serialises every ledger write (read, apply,
// write in one critical section). It is a leaf: nothing is locked under
// it, and the lifecycle's hooks take it under a sandbox's lock.
package tasks

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the ledger needs of the lifecycle core (daemon.tasksCore).
type Core interface {
	// Visible returns the sandbox if owner ("" = any) may see it.
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Store() store.Store
	Now() time.Time
}

// Auditor receives approvals, rejections and step changes (docs/STATE.md);
// nil means none.
type Auditor interface {
	Audit(ctx context.Context, actor, action, sandboxID string, data map[string]string)
}

// Config configures the service.
type Config struct {
	Auditor Auditor
	Log     *slog.Logger
}

// Service is the task ledger.
type Service struct {
	core Core
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex // every ledger write; a leaf
}

// New builds the service.
func New(core Core, cfg Config) *Service {
	l := cfg.Log
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &Service{core: core, cfg: cfg, log: l}
}

// SetAuditor sets the audit sink after construction (the audit service may
// be built after the ledger).
func (s *Service) SetAuditor(a Auditor) {
	s.mu.Lock()
	s.cfg.Auditor = a
	s.mu.Unlock()
}

// Caller is who asks: Owner limits what it sees ("" with Admin: any
// owner); Sandbox, when set, is a request from inside that sandbox (the
// in-sandbox API), which reaches only its own ledger and never decides a
// gate. Actor is what the change log and audit record.
type Caller struct {
	Owner   string
	Admin   bool
	Sandbox string
	Actor   string
}

// Ledger is a sandbox's ledger as shown: its tasks and the last restore's
// warning.
type Ledger struct {
	Tasks    []*Task   `json:"tasks"`
	Rollback *Rollback `json:"rollback,omitempty"`
}

// record is the per-sandbox ledger record in the store.
type record struct {
	Rollback *Rollback `json:"rollback,omitempty"`
}

// visible resolves the sandbox a caller names ("self" from inside a
// sandbox is that sandbox); a sandbox caller sees no other.
func (s *Service) visible(ctx context.Context, c Caller, id string) (*sandbox.Sandbox, error) {
	if c.Sandbox != "" {
		if id == "self" {
			id = c.Sandbox
		}
		if id != c.Sandbox {
			return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
		}
	}
	return s.core.Visible(ctx, c.Owner, id)
}

func (s *Service) load(ctx context.Context, id string) ([]*Task, *record, error) {
	st := s.core.Store()
	rows, err := st.ListTasks(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	out := make([]*Task, 0, len(rows))
	for _, r := range rows {
		var t Task
		if err := json.Unmarshal(r.State, &t); err != nil {
			return nil, nil, errs.Wrap(errs.Internal, err, "task %s of %s: stored state", r.ID, id)
		}
		out = append(out, &t)
	}
	var rec record
	if b, err := st.GetTaskLedger(ctx, id); err != nil {
		return nil, nil, err
	} else if b != nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, nil, errs.Wrap(errs.Internal, err, "task ledger of %s: stored record", id)
		}
	}
	return out, &rec, nil
}

// List returns a sandbox's ledger.
func (s *Service) List(ctx context.Context, c Caller, id string) (Ledger, error) {
	sb, err := s.visible(ctx, c, id)
	if err != nil {
		return Ledger{}, err
	}
	tasks, rec, err := s.load(ctx, sb.ID)
	if err != nil {
		return Ledger{}, err
	}
	return Ledger{Tasks: tasks, Rollback: rec.Rollback}, nil
}

// At returns a sandbox's ledger as it was at time at (replayed from its
// change log).
func (s *Service) At(ctx context.Context, c Caller, id string, at time.Time) ([]*Task, error) {
	sb, err := s.visible(ctx, c, id)
	if err != nil {
		return nil, err
	}
	changes, err := s.changes(ctx, sb.ID, "", at)
	if err != nil {
		return nil, err
	}
	return At(changes, at), nil
}

// Get returns one task.
func (s *Service) Get(ctx context.Context, c Caller, id, task string) (*Task, error) {
	sb, err := s.visible(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return s.get(ctx, sb.ID, task)
}

func (s *Service) get(ctx context.Context, id, task string) (*Task, error) {
	r, err := s.core.Store().GetTask(ctx, id, task)
	if err != nil {
		return nil, err
	}
	var t Task
	if err := json.Unmarshal(r.State, &t); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "task %s of %s: stored state", task, id)
	}
	return &t, nil
}

// History returns a task's change log, oldest first.
func (s *Service) History(ctx context.Context, c Caller, id, task string) ([]Change, error) {
	sb, err := s.visible(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return s.changes(ctx, sb.ID, task, time.Time{})
}

func (s *Service) changes(ctx context.Context, id, task string, until time.Time) ([]Change, error) {
	rows, err := s.core.Store().ListTaskChanges(ctx, id, task, until)
	if err != nil {
		return nil, err
	}
	out := make([]Change, 0, len(rows))
	for _, r := range rows {
		var ch Change
		if err := json.Unmarshal(r.Data, &ch); err != nil {
			s.log.Warn("task change unreadable, skipped", "sandbox_id", id, "seq", r.Seq, "err", err)
			continue
		}
		ch.Seq, ch.Task, ch.At, ch.Actor, ch.Op = r.Seq, r.Task, r.Time, r.Actor, Op(r.Op)
		out = append(out, ch)
	}
	return out, nil
}

// CreateRequest creates a task.
type CreateRequest struct {
	ID    string
	Name  string
	Steps []string
}

// Create adds a task to a sandbox's ledger.
func (s *Service) Create(ctx context.Context, c Caller, id string, req CreateRequest) (*Task, error) {
	name := req.Name
	if name == "" {
		name = req.ID
	}
	return s.change(ctx, c, id, Change{Task: req.ID, Op: OpCreate, Name: name, Steps: req.Steps})
}

// AddStep appends a pending step to a task.
func (s *Service) AddStep(ctx context.Context, c Caller, id, task, name string) (*Task, error) {
	return s.change(ctx, c, id, Change{Task: task, Op: OpStepAdd, Name: name})
}

// StepRequest changes one step: Op is OpStepStart, OpStepDone, OpStepFail
// or OpStepSkip; Step is its number (from 1) or its name.
type StepRequest struct {
	Op     Op
	Step   string
	Output string
}

// Step starts, finishes, fails or skips one step.
func (s *Service) Step(ctx context.Context, c Caller, id, task string, req StepRequest) (*Task, error) {
	switch req.Op {
	case OpStepStart, OpStepDone, OpStepFail, OpStepSkip:
	default:
		return nil, errs.Field("op", "a step is started, done, failed or skipped; got %q", req.Op)
	}
	return s.change(ctx, c, id, Change{Task: task, Op: req.Op, Output: req.Output}, req.Step)
}

// AskRequest asks for an approval. Step (a number or a name, "" = none) is
// the step that may not start before it is approved; Approvers default to
// the sandbox's owner.
type AskRequest struct {
	Question  string
	Step      string
	Approvers []string
}

// Ask adds a waiting gate to a task. From inside the sandbox the gate's
// approvers are its owner's: a sandbox may not name who approves it.
func (s *Service) Ask(ctx context.Context, c Caller, id, task string, req AskRequest) (*Task, error) {
	if c.Sandbox != "" && slices.ContainsFunc(req.Approvers, func(a string) bool { return a != ApproverOwner }) {
		return nil, &errs.Error{Kind: errs.PermissionDenied, Field: "approvers", Message: "approvers: a gate asked from inside the sandbox is approved by its owner"}
	}
	ch := Change{Task: task, Op: OpGateAsk, Question: req.Question, Approvers: req.Approvers}
	if req.Step == "" {
		return s.change(ctx, c, id, ch)
	}
	return s.change(ctx, c, id, ch, req.Step)
}

// Decide approves or rejects a waiting gate. Who may: a gate's approvers
// (the sandbox's owner for "owner", the owner of a named API key, the
// admin key for "admin"); the admin key always may. Never the sandbox
// itself (PermissionDenied). A caller who may not see the sandbox and is
// not a named approver gets NotFound, as for any other route.
func (s *Service) Decide(ctx context.Context, c Caller, id, task, gate string, d Decision, comment string) (*Task, error) {
	if c.Sandbox != "" {
		return nil, errs.E(errs.PermissionDenied, "a sandbox cannot approve or reject its own gates: its owner decides them over the API")
	}
	sb, err := s.core.Visible(ctx, c.Owner, id)
	named := false
	if errs.Is(err, errs.NotFound) && c.Owner != "" {
		// Another owner named as an approver may decide that gate (only).
		other, oerr := s.core.Visible(ctx, "", id)
		if oerr != nil {
			return nil, err
		}
		t, terr := s.get(ctx, other.ID, task)
		if terr != nil {
			return nil, err
		}
		if g := t.gate(gate); g == nil || !slices.Contains(g.Approvers, c.Owner) {
			return nil, err
		}
		sb, err, named = other, nil, true
	}
	if err != nil {
		return nil, err
	}
	if !named {
		t, err := s.get(ctx, sb.ID, task)
		if err != nil {
			return nil, err
		}
		g := t.gate(gate)
		if g == nil {
			return nil, errs.E(errs.NotFound, "task %q has no gate %q", task, gate)
		}
		if !mayDecide(*g, c, sb.Owner) {
			return nil, errs.E(errs.PermissionDenied, "gate %s of task %q may be decided by %v only", gate, task, g.Approvers)
		}
	}
	return s.apply(ctx, c, sb, Change{Task: task, Op: OpGateDone, Gate: gate, Decision: d, Comment: comment})
}

// mayDecide says whether c is one of gate g's approvers (owner is the
// sandbox's owner).
func mayDecide(g Gate, c Caller, owner string) bool {
	if c.Sandbox != "" {
		return false
	}
	if c.Admin {
		return true
	}
	for _, a := range g.Approvers {
		switch {
		case a == ApproverOwner && c.Owner == owner:
			return true
		case a != ApproverOwner && a != ApproverAdmin && a == c.Owner:
			return true
		}
	}
	return false
}

// change applies ch to a task of sandbox id, resolving a step reference
// (a number or a name) first.
func (s *Service) change(ctx context.Context, c Caller, id string, ch Change, step ...string) (*Task, error) {
	sb, err := s.visible(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if len(step) > 0 {
		t, err := s.get(ctx, sb.ID, ch.Task)
		if err != nil {
			return nil, err
		}
		if ch.Step, err = t.stepNumber(step[0]); err != nil {
			return nil, err
		}
	}
	return s.apply(ctx, c, sb, ch)
}

// stepNumber resolves "3" or a step's name (the first of that name).
func (t *Task) stepNumber(ref string) (int, error) {
	if n, err := strconv.Atoi(ref); err == nil {
		if n < 1 || n > len(t.Steps) {
			return 0, errs.Field("step", "task %q has %d steps, no step %d", t.ID, len(t.Steps), n)
		}
		return n, nil
	}
	for i, st := range t.Steps {
		if st.Name == ref {
			return i + 1, nil
		}
	}
	return 0, errs.Field("step", "task %q has no step named %q", t.ID, ref)
}

// apply is one ledger write: the task's state after ch, the change
// appended, in one store transaction under mu.
func (s *Service) apply(ctx context.Context, c Caller, sb *sandbox.Sandbox, ch Change) (*Task, error) {
	if ch.Op == OpCreate {
		if err := ValidTaskID(ch.Task); err != nil {
			return nil, err
		}
	} else if ch.Task == "" {
		return nil, errs.Field("task", "a task id is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.core.Store()
	ch.At, ch.Actor = s.core.Now().UTC(), c.Actor
	var cur *Task
	if ch.Op != OpCreate {
		t, err := s.get(ctx, sb.ID, ch.Task)
		if err != nil {
			return nil, err
		}
		cur = t
	} else {
		rows, err := st.ListTasks(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		if len(rows) >= MaxTasks {
			return nil, errs.Field("tasks", "sandbox %s has %d tasks, at most %d", sb.ID, len(rows), MaxTasks)
		}
		for _, r := range rows {
			if r.ID == ch.Task {
				return nil, errs.E(errs.AlreadyExists, "task %q already exists", ch.Task)
			}
		}
	}
	if n, err := st.CountTaskChanges(ctx, sb.ID); err != nil {
		return nil, err
	} else if n >= MaxChanges {
		return nil, errs.E(errs.ResourceExhausted, "the task log of sandbox %s holds %d changes, at most %d", sb.ID, n, MaxChanges)
	}
	next, err := Apply(cur, ch)
	if err != nil {
		return nil, err
	}
	put, err := taskRecord(next)
	if err != nil {
		return nil, err
	}
	tc, err := changeRecord(sb.ID, ch)
	if err != nil {
		return nil, err
	}
	if err := st.WriteTasks(ctx, store.TaskWrite{Sandbox: sb.ID, Put: []store.TaskRecord{put}, Changes: []store.TaskChange{tc}}); err != nil {
		return nil, err
	}
	s.audit(ctx, c.Actor, sb.ID, ch, next)
	return next, nil
}

func taskRecord(t *Task) (store.TaskRecord, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return store.TaskRecord{}, errs.Wrap(errs.Internal, err, "encode task %s", t.ID)
	}
	br, err := json.Marshal(BriefOf(t))
	if err != nil {
		return store.TaskRecord{}, errs.Wrap(errs.Internal, err, "encode task %s", t.ID)
	}
	return store.TaskRecord{ID: t.ID, State: b, Brief: br, UpdatedAt: t.UpdatedAt}, nil
}

func changeRecord(id string, ch Change) (store.TaskChange, error) {
	b, err := json.Marshal(ch)
	if err != nil {
		return store.TaskChange{}, errs.Wrap(errs.Internal, err, "encode task change")
	}
	return store.TaskChange{Sandbox: id, Task: ch.Task, Time: ch.At, Actor: ch.Actor, Op: string(ch.Op), Data: b}, nil
}

// audit reports a change (mu held: the Auditor must not block long).
func (s *Service) audit(ctx context.Context, actor, id string, ch Change, t *Task) {
	a := s.cfg.Auditor
	if a == nil {
		return
	}
	data := map[string]string{"task": ch.Task}
	action := "task." + string(ch.Op)
	switch ch.Op {
	case OpStepStart, OpStepDone, OpStepFail, OpStepSkip:
		data["step"] = strconv.Itoa(ch.Step)
		if t != nil && ch.Step <= len(t.Steps) {
			data["step_name"] = t.Steps[ch.Step-1].Name
			data["attempts"] = strconv.Itoa(t.Steps[ch.Step-1].Attempts)
		}
	case OpGateAsk:
		data["question"] = ch.Question
		if t != nil && len(t.Gates) > 0 {
			data["gate"] = t.Gates[len(t.Gates)-1].ID
		}
	case OpGateDone:
		action = "task.approve"
		if ch.Decision == Rejected {
			action = "task.reject"
		}
		data["gate"], data["comment"] = ch.Gate, ch.Comment
	}
	a.Audit(ctx, actor, action, id, data)
}

// Summary is the compact ledger shown with a sandbox; nil when it has no
// tasks and no rollback warning.
// It reads each task's brief (stored with it), not the task: it is on
// every GET and resume of a sandbox.
func (s *Service) Summary(ctx context.Context, id string) (*Summary, error) {
	st := s.core.Store()
	rows, err := st.ListTaskBriefs(ctx, id)
	if err != nil {
		return nil, err
	}
	briefs := make([]Brief, 0, len(rows))
	for _, r := range rows {
		var b Brief
		if err := json.Unmarshal(r.Brief, &b); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "task %s of %s: stored brief", r.ID, id)
		}
		briefs = append(briefs, b)
	}
	var rec record
	if b, err := st.GetTaskLedger(ctx, id); err != nil {
		return nil, err
	} else if b != nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "task ledger of %s: stored record", id)
		}
	}
	if len(briefs) == 0 && rec.Rollback == nil {
		return nil, nil
	}
	sum := SummarizeBriefs(briefs, rec.Rollback)
	return &sum, nil
}

// CurrentStep is the step a sandbox's side effects belong to ("task/N" of
// its running step; "" when none runs). It satisfies the side-effect
// ledger's StepSource (docs/STATE.md).
func (s *Service) CurrentStep(ctx context.Context, sandboxID string) string {
	tasks, _, err := s.load(ctx, sandboxID)
	if err != nil {
		return ""
	}
	return RunningStep(tasks)
}

// LastRollback is the warning of the sandbox's last restore (nil if none).
func (s *Service) LastRollback(ctx context.Context, sandboxID string) *Rollback {
	_, rec, err := s.load(ctx, sandboxID)
	if err != nil {
		return nil
	}
	return rec.Rollback
}
