package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// Task ledger (docs/TASKS.md): a sandbox's tasks, their ordered steps and
// approval gates.

func tasksPath(sandbox string) string { return "/v1/sandboxes/" + seg(sandbox) + "/tasks" }

func taskPath(sandbox, task string) string { return tasksPath(sandbox) + "/" + seg(task) }

// Tasks is the sandbox's task ledger now (and the last restore's warning).
func (c *Client) Tasks(ctx context.Context, sandbox string) (wire.TaskLedger, error) {
	return get[wire.TaskLedger](ctx, c, tasksPath(sandbox), nil)
}

// TasksAt is the sandbox's task ledger as it was at at.
func (c *Client) TasksAt(ctx context.Context, sandbox string, at time.Time) (wire.TaskLedger, error) {
	return get[wire.TaskLedger](ctx, c, tasksPath(sandbox), url.Values{"at": {at.UTC().Format(time.RFC3339Nano)}})
}

// CreateTask adds a task with ordered steps.
func (c *Client) CreateTask(ctx context.Context, sandbox string, req wire.TaskCreateRequest) (wire.Task, error) {
	return send[wire.Task](ctx, c, http.MethodPost, tasksPath(sandbox), req)
}

// Task is one task of the sandbox.
func (c *Client) Task(ctx context.Context, sandbox, task string) (wire.Task, error) {
	return get[wire.Task](ctx, c, taskPath(sandbox, task), nil)
}

// TaskHistory is the task's append-only change log, oldest first.
func (c *Client) TaskHistory(ctx context.Context, sandbox, task string) ([]wire.TaskChange, error) {
	return get[[]wire.TaskChange](ctx, c, taskPath(sandbox, task)+"/history", nil)
}

// AddTaskStep appends a pending step named name.
func (c *Client) AddTaskStep(ctx context.Context, sandbox, task, name string) (wire.Task, error) {
	return send[wire.Task](ctx, c, http.MethodPost, taskPath(sandbox, task)+"/steps", wire.TaskStepAddRequest{Name: name})
}

// TaskStep starts, finishes, fails or skips (op: start, done, fail, skip)
// step (a number from 1 or a name), recording output when not "".
func (c *Client) TaskStep(ctx context.Context, sandbox, task, step, op, output string) (wire.Task, error) {
	return send[wire.Task](ctx, c, http.MethodPost, taskPath(sandbox, task)+"/steps/"+seg(step)+"/"+seg(op), wire.TaskStepRequest{Output: output})
}

// AskTaskGate asks for an approval; the new gate is the task's last.
func (c *Client) AskTaskGate(ctx context.Context, sandbox, task string, req wire.TaskGateRequest) (wire.Task, error) {
	return send[wire.Task](ctx, c, http.MethodPost, taskPath(sandbox, task)+"/gates", req)
}

// DecideTaskGate approves (approve true) or rejects a waiting gate.
func (c *Client) DecideTaskGate(ctx context.Context, sandbox, task, gate string, approve bool, comment string) (wire.Task, error) {
	d := "reject"
	if approve {
		d = "approve"
	}
	return send[wire.Task](ctx, c, http.MethodPost, taskPath(sandbox, task)+"/gates/"+seg(gate)+"/"+d, wire.TaskDecisionRequest{Comment: comment})
}
