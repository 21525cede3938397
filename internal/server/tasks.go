package server

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/tasks"
)

// taskAPI is the handler group of the task ledger (issue 17, docs/TASKS.md).
// Its routes are reachable from inside the sandbox (the in-sandbox API,
// p.Sandbox set): the service limits such a caller to its own ledger and
// refuses it the decision of a gate.
type taskAPI struct{ *Server }

// taskCaller is who asks, as the ledger sees it.
func taskCaller(r *http.Request, p daemon.Principal) tasks.Caller {
	c := tasks.Caller{Owner: owner(r, p), Admin: p.Admin, Sandbox: p.Sandbox, Actor: p.Owner}
	if p.Sandbox != "" {
		c.Actor = "sandbox:" + p.Sandbox
	}
	if p.Admin && c.Actor == "" {
		c.Actor = "admin"
	}
	return c
}

func taskView(t *tasks.Task) wire.Task {
	out := wire.Task{ID: t.ID, Name: t.Name, Steps: make([]wire.TaskStep, 0, len(t.Steps)), Gates: make([]wire.TaskGate, 0, len(t.Gates)),
		CreatedBy: t.CreatedBy, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Forked: taskForkView(t.Forked)}
	for _, s := range t.Steps {
		out.Steps = append(out.Steps, wire.TaskStep{Name: s.Name, Status: string(s.Status), Attempts: s.Attempts,
			StartedAt: s.StartedAt, EndedAt: s.EndedAt, Output: s.Output})
	}
	for _, g := range t.Gates {
		ap := append([]string{}, g.Approvers...)
		out.Gates = append(out.Gates, wire.TaskGate{ID: g.ID, Question: g.Question, Step: g.Step, Approvers: ap,
			AskedBy: g.AskedBy, AskedAt: g.AskedAt, Decision: string(g.Decision), DecidedBy: g.DecidedBy, DecidedAt: g.DecidedAt, Comment: g.Comment})
	}
	return out
}

func taskForkView(f *tasks.Fork) *wire.TaskFork {
	if f == nil {
		return nil
	}
	return &wire.TaskFork{Parent: f.Parent, AtStep: f.AtStep, StepName: f.StepName, At: f.At}
}

func taskRollbackView(rb *tasks.Rollback) *wire.TaskRollback {
	if rb == nil {
		return nil
	}
	out := &wire.TaskRollback{At: rb.At, PointAt: rb.PointAt, From: rb.From, Checkpoint: rb.Checkpoint, Snapshot: rb.Snapshot,
		Steps: append([]string{}, rb.Steps()...), Changed: make([]wire.TaskChanged, 0, len(rb.Changed))}
	for _, c := range rb.Changed {
		out.Changed = append(out.Changed, wire.TaskChanged(c))
	}
	return out
}

func taskSummaryView(s *tasks.Summary) *wire.TaskSummary {
	if s == nil {
		return nil
	}
	return &wire.TaskSummary{Tasks: s.Tasks, Task: s.Task, Step: s.Step, StepName: s.StepName, Status: string(s.Status),
		Waiting: s.Waiting, Forked: taskForkView(s.Forked), Rollback: taskRollbackView(s.Rollback)}
}

// withTasks adds the ledger's summary to a sandbox's answer (GET, resume).
// The ledger is secondary there: a failure to read it is logged, never the
// answer's failure.
func (s *Server) withTasks(ctx context.Context, v wire.Sandbox) wire.Sandbox {
	v.Tasks = s.taskSummary(ctx, v.ID)
	return v
}

// taskSummary is withTasks's summary of sandbox id (nil: none, or it could
// not be read).
func (s *Server) taskSummary(ctx context.Context, id string) *wire.TaskSummary {
	sum, err := s.d.Tasks().Summary(ctx, id)
	if err != nil {
		s.log.WarnContext(ctx, "task summary", "sandbox_id", id, "err", err)
		return nil
	}
	return taskSummaryView(sum)
}

func (s taskAPI) writeTask(w http.ResponseWriter, status int, t *tasks.Task, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, status, taskView(t))
	return nil
}

func (s taskAPI) list(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	c, id := taskCaller(r, p), r.PathValue("id")
	out := wire.TaskLedger{Sandbox: id, Tasks: []wire.Task{}}
	if p.Sandbox != "" && id == "self" {
		out.Sandbox = p.Sandbox
	}
	var list []*tasks.Task
	if v := r.URL.Query().Get("at"); v != "" {
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return errs.Field("at", "at must be an RFC 3339 time, got %q", v)
		}
		if list, err = s.d.Tasks().At(r.Context(), c, id, at); err != nil {
			return err
		}
		out.At = at
	} else {
		l, err := s.d.Tasks().List(r.Context(), c, id)
		if err != nil {
			return err
		}
		list, out.Rollback = l.Tasks, taskRollbackView(l.Rollback)
	}
	for _, t := range list {
		out.Tasks = append(out.Tasks, taskView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s taskAPI) create(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.TaskCreateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.d.Tasks().Create(r.Context(), taskCaller(r, p), r.PathValue("id"), tasks.CreateRequest{ID: req.ID, Name: req.Name, Steps: req.Steps})
	return s.writeTask(w, http.StatusCreated, t, err)
}

func (s taskAPI) get(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	t, err := s.d.Tasks().Get(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"))
	return s.writeTask(w, http.StatusOK, t, err)
}

func (s taskAPI) history(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	h, err := s.d.Tasks().History(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"))
	if err != nil {
		return err
	}
	if len(h) == 0 { // every task has its create: none means no such task
		return errs.E(errs.NotFound, "task %q not found", r.PathValue("task"))
	}
	out := make([]wire.TaskChange, 0, len(h))
	for _, c := range h {
		out = append(out, wire.TaskChange{Seq: c.Seq, At: c.At, Actor: c.Actor, Op: string(c.Op), Name: c.Name, Step: c.Step,
			Output: c.Output, Gate: c.Gate, Decision: string(c.Decision), Comment: c.Comment, Question: c.Question})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s taskAPI) addStep(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.TaskStepAddRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.d.Tasks().AddStep(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"), req.Name)
	return s.writeTask(w, http.StatusOK, t, err)
}

var stepOps = map[string]tasks.Op{"start": tasks.OpStepStart, "done": tasks.OpStepDone, "fail": tasks.OpStepFail, "skip": tasks.OpStepSkip}

func (s taskAPI) step(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	op, ok := stepOps[r.PathValue("op")]
	if !ok {
		return errs.Field("op", "a step op is start, done, fail or skip, got %q", r.PathValue("op"))
	}
	var req wire.TaskStepRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.d.Tasks().Step(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"),
		tasks.StepRequest{Op: op, Step: r.PathValue("step"), Output: req.Output})
	return s.writeTask(w, http.StatusOK, t, err)
}

func (s taskAPI) ask(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.TaskGateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.d.Tasks().Ask(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"),
		tasks.AskRequest{Question: req.Question, Step: req.Step, Approvers: req.Approvers})
	return s.writeTask(w, http.StatusCreated, t, err)
}

func (s taskAPI) decide(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	d := map[string]tasks.Decision{"approve": tasks.Approved, "reject": tasks.Rejected}[r.PathValue("decision")]
	if d == "" {
		return errs.Field("decision", "a gate is approved or rejected, got %q", r.PathValue("decision"))
	}
	var req wire.TaskDecisionRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.d.Tasks().Decide(r.Context(), taskCaller(r, p), r.PathValue("id"), r.PathValue("task"), r.PathValue("gate"), d, req.Comment)
	return s.writeTask(w, http.StatusOK, t, err)
}
