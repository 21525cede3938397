package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// stateTables owns the state beyond the machine: the task ledger (tasks,
// task_changes, task_ledgers), handoff notes (notes.go), the audit chain
// (audit.go), credential leases (leases.go) and the side-effect ledger
// (effects.go).
type stateTables struct{ *conn }

// TaskStore holds the task ledger of internal/tasks: per sandbox, its
// tasks as they are now (State is the service's JSON, opaque here), the
// append-only log of changes they are replayed from, and one ledger record
// (the service's JSON). Deleting a sandbox deletes all three.
type TaskStore interface {
	// WriteTasks applies one ledger write in one transaction: puts (a new
	// task is numbered after the sandbox's others; an existing one keeps
	// its number), deletes, appended changes and, when Ledger is not nil,
	// the ledger record. A sandbox that does not exist is NotFound.
	WriteTasks(ctx context.Context, w TaskWrite) error
	// ListTasks returns a sandbox's tasks in creation order.
	ListTasks(ctx context.Context, sandboxID string) ([]TaskRecord, error)
	// ListTaskBriefs is ListTasks without State (ID, Seq, Brief, UpdatedAt).
	ListTaskBriefs(ctx context.Context, sandboxID string) ([]TaskRecord, error)
	GetTask(ctx context.Context, sandboxID, taskID string) (TaskRecord, error)
	// ListTaskChanges returns a sandbox's changes in the order they were
	// appended: of one task (taskID "" = all), made at or before until
	// (zero = all).
	ListTaskChanges(ctx context.Context, sandboxID, taskID string, until time.Time) ([]TaskChange, error)
	CountTaskChanges(ctx context.Context, sandboxID string) (int, error)
	// GetTaskLedger returns the ledger record, nil when there is none.
	GetTaskLedger(ctx context.Context, sandboxID string) ([]byte, error)
}

// TaskRecord is one task as it is now.
type TaskRecord struct {
	Sandbox   string
	ID        string
	Seq       int64 // creation order, set by the store
	State     []byte
	Brief     []byte // the service's summary of State (JSON), read without it
	UpdatedAt time.Time
}

// TaskChange is one entry of the change log.
type TaskChange struct {
	Seq     int64 // set by the store
	Sandbox string
	Task    string
	Time    time.Time
	Actor   string
	Op      string
	Data    []byte
}

// TaskWrite is one atomic ledger write of one sandbox.
type TaskWrite struct {
	Sandbox string
	Put     []TaskRecord
	Delete  []string
	Changes []TaskChange
	Ledger  []byte
}

func (s *stateTables) WriteTasks(ctx context.Context, w TaskWrite) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, w.Sandbox).Scan(&one); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.E(errs.NotFound, "sandbox %s not found", w.Sandbox)
			}
			return dbErr(err, "store: tasks of %s", w.Sandbox)
		}
		for _, id := range w.Delete {
			if _, err := tx.ExecContext(ctx, `DELETE FROM tasks WHERE sandbox_id = ? AND task_id = ?`, w.Sandbox, id); err != nil {
				return dbErr(err, "store: delete task %s of %s", id, w.Sandbox)
			}
		}
		for _, t := range w.Put {
			if t.ID == "" {
				return errs.Field("id", "a task needs an id")
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO tasks (sandbox_id, task_id, seq, state, brief, updated_at)
				VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks WHERE sandbox_id = ?), ?, ?, ?)
				ON CONFLICT (sandbox_id, task_id) DO UPDATE SET state = excluded.state, brief = excluded.brief, updated_at = excluded.updated_at`,
				w.Sandbox, t.ID, w.Sandbox, string(t.State), string(t.Brief), toNanos(t.UpdatedAt)); err != nil {
				return dbErr(err, "store: put task %s of %s", t.ID, w.Sandbox)
			}
		}
		for _, c := range w.Changes {
			if _, err := tx.ExecContext(ctx, `INSERT INTO task_changes (sandbox_id, task_id, time, actor, op, data)
				VALUES (?, ?, ?, ?, ?, ?)`, w.Sandbox, c.Task, toNanos(c.Time), c.Actor, c.Op, string(c.Data)); err != nil {
				return dbErr(err, "store: append task change of %s", w.Sandbox)
			}
		}
		if w.Ledger != nil {
			if _, err := tx.ExecContext(ctx, `INSERT INTO task_ledgers (sandbox_id, data) VALUES (?, ?)
				ON CONFLICT (sandbox_id) DO UPDATE SET data = excluded.data`, w.Sandbox, string(w.Ledger)); err != nil {
				return dbErr(err, "store: put task ledger of %s", w.Sandbox)
			}
		}
		return nil
	})
}

func scanTask(sc scanner) (TaskRecord, error) {
	var (
		t            TaskRecord
		state, brief string
		updated      int64
	)
	if err := sc.Scan(&t.Sandbox, &t.ID, &t.Seq, &state, &brief, &updated); err != nil {
		return TaskRecord{}, err
	}
	t.State, t.Brief, t.UpdatedAt = []byte(state), []byte(brief), fromNanos(updated)
	if state == "" {
		t.State = nil
	}
	return t, nil
}

const taskCols = `sandbox_id, task_id, seq, state, brief, updated_at`

func (s *stateTables) ListTasks(ctx context.Context, sandboxID string) ([]TaskRecord, error) {
	return s.listTasks(ctx, sandboxID, taskCols)
}

func (s *stateTables) ListTaskBriefs(ctx context.Context, sandboxID string) ([]TaskRecord, error) {
	return s.listTasks(ctx, sandboxID, `sandbox_id, task_id, seq, '', brief, updated_at`)
}

func (s *stateTables) listTasks(ctx context.Context, sandboxID, cols string) ([]TaskRecord, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+cols+` FROM tasks WHERE sandbox_id = ? ORDER BY seq`, sandboxID)
	if err != nil {
		return nil, dbErr(err, "store: list tasks of %s", sandboxID)
	}
	defer rows.Close()
	out := []TaskRecord{}
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, dbErr(err, "store: list tasks of %s", sandboxID)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list tasks of %s", sandboxID)
	}
	return out, nil
}

func (s *stateTables) GetTask(ctx context.Context, sandboxID, taskID string) (TaskRecord, error) {
	t, err := scanTask(s.r.QueryRowContext(ctx, `SELECT `+taskCols+` FROM tasks WHERE sandbox_id = ? AND task_id = ?`, sandboxID, taskID))
	if errors.Is(err, sql.ErrNoRows) {
		return TaskRecord{}, errs.E(errs.NotFound, "task %q of sandbox %s not found", taskID, sandboxID)
	}
	if err != nil {
		return TaskRecord{}, dbErr(err, "store: get task %s of %s", taskID, sandboxID)
	}
	return t, nil
}

func (s *stateTables) ListTaskChanges(ctx context.Context, sandboxID, taskID string, until time.Time) ([]TaskChange, error) {
	q := `SELECT seq, sandbox_id, task_id, time, actor, op, data FROM task_changes WHERE sandbox_id = ?`
	args := []any{sandboxID}
	if taskID != "" {
		q += ` AND task_id = ?`
		args = append(args, taskID)
	}
	if !until.IsZero() {
		q += ` AND time <= ?`
		args = append(args, toNanos(until))
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY seq`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list task changes of %s", sandboxID)
	}
	defer rows.Close()
	out := []TaskChange{}
	for rows.Next() {
		var (
			c    TaskChange
			at   int64
			data string
		)
		if err := rows.Scan(&c.Seq, &c.Sandbox, &c.Task, &at, &c.Actor, &c.Op, &data); err != nil {
			return nil, dbErr(err, "store: list task changes of %s", sandboxID)
		}
		c.Time, c.Data = fromNanos(at), []byte(data)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list task changes of %s", sandboxID)
	}
	return out, nil
}

func (s *stateTables) CountTaskChanges(ctx context.Context, sandboxID string) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM task_changes WHERE sandbox_id = ?`, sandboxID).Scan(&n); err != nil {
		return 0, dbErr(err, "store: count task changes of %s", sandboxID)
	}
	return n, nil
}

func (s *stateTables) GetTaskLedger(ctx context.Context, sandboxID string) ([]byte, error) {
	var data string
	err := s.r.QueryRowContext(ctx, `SELECT data FROM task_ledgers WHERE sandbox_id = ?`, sandboxID).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr(err, "store: get task ledger of %s", sandboxID)
	}
	return []byte(data), nil
}
