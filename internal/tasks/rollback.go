package tasks

import (
	"strconv"
	"time"
)

// Changed is one step or gate whose state differs between the ledger now
// and the ledger at an older point: what a rollback to that point undoes.
// Now/Then are statuses (a step's status; a gate's "waiting", "approved"
// or "rejected"); "" means it did not exist.
type Changed struct {
	Task  string `json:"task"`
	Kind  string `json:"kind"`  // step | gate
	Index int    `json:"index"` // step number (1-based) or gate number
	Name  string `json:"name"`  // step name or gate id
	Now   string `json:"now"`
	Then  string `json:"then"`
}

// Rollback is the warning a restore leaves on a ledger: it was rolled back
// to PointAt (a checkpoint or a snapshot of From), undoing Changed.
type Rollback struct {
	At         time.Time `json:"at"`
	PointAt    time.Time `json:"point_at"`
	From       string    `json:"from"`
	Checkpoint string    `json:"checkpoint,omitempty"`
	Snapshot   string    `json:"snapshot,omitempty"`
	Changed    []Changed `json:"changed"`
}

// Steps names the steps a rollback undid, "task/N (name)" each.
func (r *Rollback) Steps() []string {
	var out []string
	for _, c := range r.Changed {
		if c.Kind == "step" {
			out = append(out, c.Task+"/"+strconv.Itoa(c.Index)+" ("+c.Name+")")
		}
	}
	return out
}

func gateStatus(g Gate) string {
	if g.Decision == Waiting {
		return "waiting"
	}
	return string(g.Decision)
}

// Diff lists what differs between the ledger now and the ledger then, in
// the order of now's tasks (then's vanished ones after).
func Diff(now, then []*Task) []Changed {
	out := []Changed{}
	index := func(l []*Task) map[string]*Task {
		m := map[string]*Task{}
		for _, t := range l {
			m[t.ID] = t
		}
		return m
	}
	nowBy, thenBy := index(now), index(then)
	pair := func(id string, a, b *Task) {
		var as, bs []Step
		var ag, bg []Gate
		if a != nil {
			as, ag = a.Steps, a.Gates
		}
		if b != nil {
			bs, bg = b.Steps, b.Gates
		}
		for i := 0; i < max(len(as), len(bs)); i++ {
			c := Changed{Task: id, Kind: "step", Index: i + 1}
			var x, y *Step
			if i < len(as) {
				x, c.Name, c.Now = &as[i], as[i].Name, string(as[i].Status)
			}
			if i < len(bs) {
				y, c.Name, c.Then = &bs[i], bs[i].Name, string(bs[i].Status)
			}
			if x == nil || y == nil || !sameStep(*x, *y) {
				out = append(out, c)
			}
		}
		for i := 0; i < max(len(ag), len(bg)); i++ {
			c := Changed{Task: id, Kind: "gate", Index: i + 1}
			var x, y *Gate
			if i < len(ag) {
				x, c.Name, c.Now = &ag[i], ag[i].ID, gateStatus(ag[i])
			}
			if i < len(bg) {
				y, c.Name, c.Then = &bg[i], bg[i].ID, gateStatus(bg[i])
			}
			if x == nil || y == nil || x.Decision != y.Decision || x.Question != y.Question || !x.DecidedAt.Equal(y.DecidedAt) {
				out = append(out, c)
			}
		}
	}
	for _, t := range now {
		pair(t.ID, t, thenBy[t.ID])
	}
	for _, t := range then {
		if nowBy[t.ID] == nil {
			pair(t.ID, nil, t)
		}
	}
	return out
}

// Summary is the compact view of a ledger shown with its sandbox.
type Summary struct {
	Tasks    int       `json:"tasks"`
	Task     string    `json:"task,omitempty"`      // the current task
	Step     int       `json:"step,omitempty"`      // its current step (1-based)
	StepName string    `json:"step_name,omitempty"` // and that step's name
	Status   Status    `json:"status,omitempty"`    // and status
	Waiting  []string  `json:"waiting,omitempty"`   // gates waiting for a decision, "task/gid"
	Forked   *Fork     `json:"forked,omitempty"`    // of the current task
	Rollback *Rollback `json:"rollback,omitempty"`  // the last restore's warning
}

// current is a task's current step: the running one, else the first that
// is pending or failed; 0 when every step is done or skipped.
func (t *Task) current() int {
	for i, s := range t.Steps {
		if s.Status == Running {
			return i + 1
		}
	}
	for i, s := range t.Steps {
		if s.Status == Pending || s.Status == Failed {
			return i + 1
		}
	}
	return 0
}

// Brief is what a summary needs of one task, stored beside it so that
// showing a sandbox's ledger does not decode every step.
type Brief struct {
	ID        string    `json:"id"`
	Step      int       `json:"step,omitempty"` // its current step; 0 = every step done or skipped
	StepName  string    `json:"step_name,omitempty"`
	Status    Status    `json:"status,omitempty"`
	Waiting   []string  `json:"waiting,omitempty"` // ids of its waiting gates
	UpdatedAt time.Time `json:"updated_at"`
	Forked    *Fork     `json:"forked,omitempty"`
}

// BriefOf is t's brief.
func BriefOf(t *Task) Brief {
	b := Brief{ID: t.ID, UpdatedAt: t.UpdatedAt, Forked: t.Forked}
	if n := t.current(); n > 0 {
		b.Step, b.StepName, b.Status = n, t.Steps[n-1].Name, t.Steps[n-1].Status
	}
	for _, g := range t.Gates {
		if g.Decision == Waiting {
			b.Waiting = append(b.Waiting, g.ID)
		}
	}
	return b
}

// Summarize is SummarizeBriefs of the ledger's tasks.
func Summarize(ledger []*Task, rb *Rollback) Summary {
	bs := make([]Brief, 0, len(ledger))
	for _, t := range ledger {
		bs = append(bs, BriefOf(t))
	}
	return SummarizeBriefs(bs, rb)
}

// SummarizeBriefs picks the current task — the most recently changed one
// with a step still to do (ties: the later created), else the most
// recently changed — its current step, and every waiting gate.
func SummarizeBriefs(ledger []Brief, rb *Rollback) Summary {
	s := Summary{Tasks: len(ledger), Rollback: rb}
	var cur *Brief
	open := false
	for i := range ledger {
		t := &ledger[i]
		o := t.Step > 0
		switch {
		case cur == nil, o && !open, o == open && !t.UpdatedAt.Before(cur.UpdatedAt):
			cur, open = t, o
		}
		for _, g := range t.Waiting {
			s.Waiting = append(s.Waiting, t.ID+"/"+g)
		}
	}
	if cur != nil {
		s.Task, s.Forked = cur.ID, cur.Forked
		s.Step, s.StepName, s.Status = cur.Step, cur.StepName, cur.Status
	}
	return s
}

// RunningStep is the step side effects are attributed to: "task/N" of a
// running step of the current task, else of any task; "" when none runs.
func RunningStep(ledger []*Task) string {
	s := Summarize(ledger, nil)
	if s.Status == Running {
		return s.Task + "/" + strconv.Itoa(s.Step)
	}
	for _, t := range ledger {
		for i, st := range t.Steps {
			if st.Status == Running {
				return t.ID + "/" + strconv.Itoa(i+1)
			}
		}
	}
	return ""
}

// ForkCopy is the ledger a fork child starts with: the parent's ledger at
// the fork point, each task marked as forked from parent at its current step.
func ForkCopy(ledger []*Task, parent string, at time.Time) []*Task {
	out := make([]*Task, 0, len(ledger))
	for _, t := range ledger {
		n := t.Clone()
		step := n.current()
		if step == 0 {
			step = len(n.Steps)
		}
		f := &Fork{Parent: parent, AtStep: step, At: at}
		if step > 0 {
			f.StepName = n.Steps[step-1].Name
		}
		n.Forked = f
		out = append(out, n)
	}
	return out
}

func sameStep(a, b Step) bool {
	return a.Name == b.Name && a.Status == b.Status && a.Attempts == b.Attempts && a.Output == b.Output &&
		a.StartedAt.Equal(b.StartedAt) && a.EndedAt.Equal(b.EndedAt)
}
