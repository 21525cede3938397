package tasks

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/errs"
)

// Bounds of one sandbox's ledger. Everything in it may come from the
// sandbox itself (the in-sandbox API), so every count and string is capped.
const (
	MaxTasks     = 64    // tasks per sandbox
	MaxSteps     = 256   // steps per task
	MaxGates     = 64    // gates per task
	MaxName      = 128   // bytes of a task id, task name or step name
	MaxText      = 1024  // bytes of an output reference, a question or a comment
	MaxApprovers = 16    // named approvers of one gate
	MaxAttempts  = 1000  // starts of one step
	MaxChanges   = 20000 // entries of one sandbox's change log
)

// Status is a step's state.
type Status string

const (
	Pending Status = "pending"
	Running Status = "running"
	Done    Status = "done"
	Failed  Status = "failed"
	Skipped Status = "skipped"
)

// Decision is a gate's outcome; "" while it waits.
type Decision string

const (
	Waiting  Decision = ""
	Approved Decision = "approved"
	Rejected Decision = "rejected"
)

// Approver names in a gate's Approvers: the sandbox's owner, the admin key,
// or (any other value) the owner of a named API key.
const (
	ApproverOwner = "owner"
	ApproverAdmin = "admin"
)

// Step is one ordered step of a task.
type Step struct {
	Name      string    `json:"name"`
	Status    Status    `json:"status"`
	Attempts  int       `json:"attempts"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Output    string    `json:"output,omitempty"` // a short reference (text or URL) to what the step produced
}

// Gate is an approval a task waits for. Step (1-based, 0 = none) is the
// step that may not start until the gate is approved.
type Gate struct {
	ID        string    `json:"id"`
	Question  string    `json:"question"`
	Step      int       `json:"step,omitempty"`
	Approvers []string  `json:"approvers"`
	AskedBy   string    `json:"asked_by"`
	AskedAt   time.Time `json:"asked_at"`
	Decision  Decision  `json:"decision,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
	Comment   string    `json:"comment,omitempty"`
}

// Fork marks a task copied into a fork child: of which parent, at which
// step of the task (1-based; 0 = before its first step).
type Fork struct {
	Parent   string    `json:"parent"`
	AtStep   int       `json:"at_step"`
	StepName string    `json:"step_name,omitempty"`
	At       time.Time `json:"at"`
}

// Task is one task of a sandbox's ledger.
type Task struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Steps     []Step    `json:"steps"`
	Gates     []Gate    `json:"gates"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Forked    *Fork     `json:"forked,omitempty"`
}

// Op is the kind of one change of the log.
type Op string

const (
	OpCreate    Op = "create"
	OpStepAdd   Op = "step_add"
	OpStepStart Op = "step_start"
	OpStepDone  Op = "step_done"
	OpStepFail  Op = "step_fail"
	OpStepSkip  Op = "step_skip"
	OpGateAsk   Op = "gate_ask"
	OpGateDone  Op = "gate_decide"
	// OpReset replaces the task by State (nil: the task is gone): a fork's
	// copy or a restore's rollback. It keeps the log append-only.
	OpReset Op = "reset"
)

// Change is one entry of a task's append-only change log: replaying a
// sandbox's changes up to time T gives its ledger at T.
type Change struct {
	Seq   int64     `json:"-"` // the store's order
	Task  string    `json:"task"`
	At    time.Time `json:"at"`
	Actor string    `json:"actor"`
	Op    Op        `json:"op"`

	Name      string   `json:"name,omitempty"`  // create (task name), step_add (step name)
	Steps     []string `json:"steps,omitempty"` // create
	Step      int      `json:"step,omitempty"`  // step ops (1-based); gate_ask (the gated step)
	Output    string   `json:"output,omitempty"`
	Gate      string   `json:"gate,omitempty"` // gate_decide
	Decision  Decision `json:"decision,omitempty"`
	Comment   string   `json:"comment,omitempty"`
	Question  string   `json:"question,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
	State     *Task    `json:"state,omitempty"` // reset
}

// CheckName validates a task id, task name or step name (field names it).
func CheckName(field, v string) error {
	if v == "" {
		return errs.Field(field, "%s must not be empty", field)
	}
	return checkText(field, v, MaxName)
}

func checkText(field, v string, max int) error {
	if len(v) > max {
		return errs.Field(field, "%s is %d bytes, at most %d", field, len(v), max)
	}
	if !utf8.ValidString(v) {
		return errs.Field(field, "%s is not valid UTF-8", field)
	}
	for _, r := range v {
		if r < 0x20 && r != '\t' || r == 0x7f {
			return errs.Field(field, "%s holds a control character", field)
		}
	}
	return nil
}

// ValidTaskID says whether id is usable as a task id in paths and the CLI:
// 1..128 bytes of [A-Za-z0-9._-].
func ValidTaskID(id string) error {
	if err := CheckName("id", id); err != nil {
		return err
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return errs.Field("id", "task id %q: only letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// Check validates a change's own fields (bounds, names) before it is
// applied; Apply checks it against the task.
func (c Change) Check() error {
	switch c.Op {
	case OpCreate:
		if err := ValidTaskID(c.Task); err != nil {
			return err
		}
		if err := CheckName("name", c.Name); err != nil {
			return err
		}
		if len(c.Steps) > MaxSteps {
			return errs.Field("steps", "%d steps, at most %d per task", len(c.Steps), MaxSteps)
		}
		for i, s := range c.Steps {
			if err := CheckName("steps["+strconv.Itoa(i)+"]", s); err != nil {
				return err
			}
		}
	case OpStepAdd:
		return CheckName("name", c.Name)
	case OpStepStart, OpStepDone, OpStepFail, OpStepSkip:
		if c.Step < 1 {
			return errs.Field("step", "step must be a step number from 1 or a step name")
		}
		return checkText("output", c.Output, MaxText)
	case OpGateAsk:
		if c.Question == "" {
			return errs.Field("question", "a gate needs a question")
		}
		if err := checkText("question", c.Question, MaxText); err != nil {
			return err
		}
		if c.Step < 0 {
			return errs.Field("step", "step must be a step number from 1, or 0 for none")
		}
		if len(c.Approvers) > MaxApprovers {
			return errs.Field("approvers", "%d approvers, at most %d", len(c.Approvers), MaxApprovers)
		}
		for i, a := range c.Approvers {
			if err := CheckName("approvers["+strconv.Itoa(i)+"]", a); err != nil {
				return err
			}
		}
	case OpGateDone:
		if c.Decision != Approved && c.Decision != Rejected {
			return errs.Field("decision", "decision must be approved or rejected, got %q", c.Decision)
		}
		if c.Gate == "" {
			return errs.Field("gate", "a gate id is required")
		}
		return checkText("comment", c.Comment, MaxText)
	case OpReset:
	default:
		return errs.Field("op", "unknown change %q", c.Op)
	}
	return nil
}

// Apply is the ledger's transition table: the task after change c (t nil:
// the task does not exist; a nil result: it no longer does). t is not
// modified. An illegal change is a typed error naming what is wrong.
func Apply(t *Task, c Change) (*Task, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if c.Op == OpReset {
		return c.State.Clone(), nil
	}
	if c.Op == OpCreate {
		if t != nil {
			return nil, errs.E(errs.AlreadyExists, "task %q already exists", c.Task)
		}
		n := &Task{ID: c.Task, Name: c.Name, Steps: []Step{}, Gates: []Gate{}, CreatedBy: c.Actor, CreatedAt: c.At, UpdatedAt: c.At}
		for _, s := range c.Steps {
			n.Steps = append(n.Steps, Step{Name: s, Status: Pending})
		}
		return n, nil
	}
	if t == nil {
		return nil, errs.E(errs.NotFound, "task %q not found", c.Task)
	}
	n := t.Clone()
	n.UpdatedAt = c.At
	switch c.Op {
	case OpStepAdd:
		if len(n.Steps) >= MaxSteps {
			return nil, errs.Field("steps", "task %q has %d steps, at most %d", n.ID, len(n.Steps), MaxSteps)
		}
		n.Steps = append(n.Steps, Step{Name: c.Name, Status: Pending})
		return n, nil
	case OpStepStart, OpStepDone, OpStepFail, OpStepSkip:
		if c.Step > len(n.Steps) {
			return nil, errs.Field("step", "task %q has %d steps, no step %d", n.ID, len(n.Steps), c.Step)
		}
		return n, n.stepChange(c)
	case OpGateAsk:
		if c.Step > len(n.Steps) {
			return nil, errs.Field("step", "task %q has %d steps, no step %d", n.ID, len(n.Steps), c.Step)
		}
		if len(n.Gates) >= MaxGates {
			return nil, errs.Field("gates", "task %q has %d gates, at most %d", n.ID, len(n.Gates), MaxGates)
		}
		ap := c.Approvers
		if len(ap) == 0 {
			ap = []string{ApproverOwner}
		}
		n.Gates = append(n.Gates, Gate{ID: "g" + strconv.Itoa(len(n.Gates)+1), Question: c.Question, Step: c.Step,
			Approvers: slices.Clone(ap), AskedBy: c.Actor, AskedAt: c.At})
		return n, nil
	case OpGateDone:
		g := n.gate(c.Gate)
		if g == nil {
			return nil, errs.E(errs.NotFound, "task %q has no gate %q", n.ID, c.Gate)
		}
		if g.Decision != Waiting {
			return nil, errs.E(errs.FailedPrecondition, "gate %s of task %q is already %s", g.ID, n.ID, g.Decision)
		}
		g.Decision, g.DecidedBy, g.DecidedAt, g.Comment = c.Decision, c.Actor, c.At, c.Comment
		return n, nil
	}
	return nil, errs.Field("op", "unknown change %q", c.Op)
}

func (t *Task) gate(id string) *Gate {
	for i := range t.Gates {
		if t.Gates[i].ID == id {
			return &t.Gates[i]
		}
	}
	return nil
}

// stepChange applies a step op to t (a private copy). Starting counts an
// attempt; done/fail of a pending step counts its (only) attempt too.
func (t *Task) stepChange(c Change) error {
	s := &t.Steps[c.Step-1]
	bad := func() error {
		return errs.E(errs.FailedPrecondition, "step %d (%s) of task %q is %s: cannot %s it",
			c.Step, s.Name, t.ID, s.Status, opVerb(c.Op))
	}
	switch c.Op {
	case OpStepStart:
		if s.Status != Pending && s.Status != Failed {
			return bad()
		}
		for _, g := range t.Gates {
			if g.Step == c.Step && g.Decision != Approved {
				what := "waits for"
				if g.Decision == Rejected {
					what = "was rejected at"
				}
				return errs.E(errs.FailedPrecondition, "step %d (%s) of task %q %s gate %s: %s", c.Step, s.Name, t.ID, what, g.ID, g.Question)
			}
		}
		if s.Attempts >= MaxAttempts {
			return errs.E(errs.ResourceExhausted, "step %d of task %q was started %d times, at most %d", c.Step, t.ID, s.Attempts, MaxAttempts)
		}
		s.Status, s.Attempts, s.StartedAt, s.EndedAt = Running, s.Attempts+1, c.At, time.Time{}
		if c.Output != "" {
			s.Output = c.Output
		}
	case OpStepDone, OpStepFail:
		switch s.Status {
		case Running:
		case Pending:
			s.Attempts, s.StartedAt = s.Attempts+1, c.At
		default:
			return bad()
		}
		s.Status, s.EndedAt = Done, c.At
		if c.Op == OpStepFail {
			s.Status = Failed
		}
		if c.Output != "" {
			s.Output = c.Output
		}
	case OpStepSkip:
		if s.Status != Pending && s.Status != Failed {
			return bad()
		}
		s.Status, s.EndedAt = Skipped, c.At
		if c.Output != "" {
			s.Output = c.Output
		}
	}
	return nil
}

func opVerb(op Op) string {
	switch op {
	case OpStepStart:
		return "start"
	case OpStepDone:
		return "finish"
	case OpStepFail:
		return "fail"
	case OpStepSkip:
		return "skip"
	}
	return string(op)
}

// Clone is a deep copy (nil for nil).
func (t *Task) Clone() *Task {
	if t == nil {
		return nil
	}
	n := *t
	n.Steps = slices.Clone(t.Steps)
	if n.Steps == nil {
		n.Steps = []Step{}
	}
	n.Gates = make([]Gate, len(t.Gates))
	for i, g := range t.Gates {
		g.Approvers = slices.Clone(g.Approvers)
		n.Gates[i] = g
	}
	if t.Forked != nil {
		f := *t.Forked
		n.Forked = &f
	}
	return &n
}

// Replay applies changes in order and returns the ledger they build, tasks
// in the order they were created. A change that does not apply (it was
// refused when it was made, so never stored; or a corrupt row) is skipped.
func Replay(changes []Change) []*Task {
	byID := map[string]*Task{}
	var order []string
	for _, c := range changes {
		prev := byID[c.Task]
		n, err := Apply(prev, c)
		if err != nil {
			continue
		}
		if prev == nil || n == nil {
			order = slices.DeleteFunc(order, func(id string) bool { return id == c.Task })
		}
		if prev == nil && n != nil {
			order = append(order, c.Task)
		}
		byID[c.Task] = n
	}
	out := make([]*Task, 0, len(order))
	for _, id := range order {
		if t := byID[id]; t != nil {
			out = append(out, t)
		}
	}
	return out
}

// At is the ledger at time at: the replay of the changes made at or before it.
func At(changes []Change, at time.Time) []*Task {
	var upto []Change
	for _, c := range changes {
		if !c.At.After(at) {
			upto = append(upto, c)
		}
	}
	return Replay(upto)
}
