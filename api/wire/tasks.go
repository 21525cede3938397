package wire

import "time"

// Task ledger (issue 17, docs/TASKS.md): /v1/sandboxes/{id}/tasks[...].

// TaskStep is one ordered step of a task. Status is pending, running,
// done, failed or skipped; Attempts counts its starts.
type TaskStep struct {
	Name      string    `json:"name"`
	Status    string    `json:"status"`
	Attempts  int       `json:"attempts"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Output    string    `json:"output,omitempty"`
}

// TaskGate is an approval a task asks for. Step (from 1; 0 = none) may not
// start before it is approved. Approvers: "owner" (the sandbox's owner),
// "admin", or the owner name of another API key. Decision is "" while it
// waits, then approved or rejected.
type TaskGate struct {
	ID        string    `json:"id"`
	Question  string    `json:"question"`
	Step      int       `json:"step,omitempty"`
	Approvers []string  `json:"approvers"`
	AskedBy   string    `json:"asked_by"`
	AskedAt   time.Time `json:"asked_at"`
	Decision  string    `json:"decision,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
	Comment   string    `json:"comment,omitempty"`
}

// TaskFork marks a task copied into a fork child: from which parent, at
// which step (from 1) of the task.
type TaskFork struct {
	Parent   string    `json:"parent"`
	AtStep   int       `json:"at_step"`
	StepName string    `json:"step_name,omitempty"`
	At       time.Time `json:"at"`
}

// Task is one task of a sandbox's ledger.
type Task struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Steps     []TaskStep `json:"steps"`
	Gates     []TaskGate `json:"gates"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	Forked    *TaskFork  `json:"forked,omitempty"`
}

// TaskChanged is one step or gate a rollback undid: its status now (before
// the rollback) and then (at the restored point; "" = it did not exist).
type TaskChanged struct {
	Task  string `json:"task"`
	Kind  string `json:"kind"` // step | gate
	Index int    `json:"index"`
	Name  string `json:"name"`
	Now   string `json:"now"`
	Then  string `json:"then"`
}

// TaskRollback is the warning a restore leaves on a ledger: rolled back to
// PointAt (Checkpoint of a rewind, or Snapshot of From for a sandbox
// created from a snapshot); Steps names the steps undone, "task/N (name)".
type TaskRollback struct {
	At         time.Time     `json:"at"`
	PointAt    time.Time     `json:"point_at"`
	From       string        `json:"from"`
	Checkpoint string        `json:"checkpoint,omitempty"`
	Snapshot   string        `json:"snapshot,omitempty"`
	Steps      []string      `json:"steps"`
	Changed    []TaskChanged `json:"changed"`
}

// TaskLedger is GET /v1/sandboxes/{id}/tasks: the ledger now, or at At
// (?at=RFC 3339 time) replayed from its change log.
type TaskLedger struct {
	Sandbox  string        `json:"sandbox"`
	At       time.Time     `json:"at,omitzero"`
	Tasks    []Task        `json:"tasks"`
	Rollback *TaskRollback `json:"rollback,omitempty"`
}

// TaskSummary is the compact ledger shown with a sandbox (GET, resume):
// the current task, its current step, the gates waiting ("task/gate"),
// the current task's fork mark and the last restore's warning.
type TaskSummary struct {
	Tasks    int           `json:"tasks"`
	Task     string        `json:"task,omitempty"`
	Step     int           `json:"step,omitempty"`
	StepName string        `json:"step_name,omitempty"`
	Status   string        `json:"status,omitempty"`
	Waiting  []string      `json:"waiting,omitempty"`
	Forked   *TaskFork     `json:"forked,omitempty"`
	Rollback *TaskRollback `json:"rollback,omitempty"`
}

// TaskChange is one entry of a task's append-only change log (op: create,
// step_add, step_start, step_done, step_fail, step_skip, gate_ask,
// gate_decide, reset).
type TaskChange struct {
	Seq      int64     `json:"seq"`
	At       time.Time `json:"at"`
	Actor    string    `json:"actor"`
	Op       string    `json:"op"`
	Name     string    `json:"name,omitempty"`
	Step     int       `json:"step,omitempty"`
	Output   string    `json:"output,omitempty"`
	Gate     string    `json:"gate,omitempty"`
	Decision string    `json:"decision,omitempty"`
	Comment  string    `json:"comment,omitempty"`
	Question string    `json:"question,omitempty"`
}

// TaskCreateRequest is the body of POST /v1/sandboxes/{id}/tasks.
type TaskCreateRequest struct {
	ID    string   `json:"id"`
	Name  string   `json:"name,omitempty"`
	Steps []string `json:"steps,omitempty"`
}

// TaskStepAddRequest is the body of POST .../tasks/{task}/steps.
type TaskStepAddRequest struct {
	Name string `json:"name"`
}

// TaskStepRequest is the body of POST .../tasks/{task}/steps/{step}/{op}
// ({step}: a number from 1 or a step name; {op}: start, done, fail, skip).
type TaskStepRequest struct {
	Output string `json:"output,omitempty"`
}

// TaskGateRequest is the body of POST .../tasks/{task}/gates. Step (a
// number or a name) is the step the gate holds; Approvers default to the
// owner (and must be from inside the sandbox).
type TaskGateRequest struct {
	Question  string   `json:"question"`
	Step      string   `json:"step,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
}

// TaskDecisionRequest is the body of POST .../gates/{gate}/approve|reject.
type TaskDecisionRequest struct {
	Comment string `json:"comment,omitempty"`
}
