package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Checkpoint is one point on a sandbox's timeline (internal/timeline): a
// delta layer holding only what changed since the checkpoint before it
// (Prev), the whole stack of layers that makes its view (Layers, top first:
// [Δk, ..., Δ1, snapshot?, template...]) and optionally a memory image.
type Checkpoint struct {
	ID         string
	Sandbox    string
	Owner      string
	Seq        int64 // 1, 2, ... per sandbox, assigned by CreateCheckpoint
	Name       string
	Layer      string   // the delta layer's digest
	Layers     []string // the view, top first (Layers[0] == Layer)
	Prev       string   // the checkpoint the delta is taken against ("" = the sandbox's boot layers)
	Runtime    string
	MemoryPath string // host path of the memory image, "" = files only
	Mode       string // "memory" or "files"
	Reason     string // why files only when memory was asked for
	Bytes      int64  // bytes of regular files in the delta layer
	Entries    int64  // entries of the delta layer
	CreatedAt  time.Time
}

// TimelineHead is what a sandbox's running view was last set to by a
// checkpoint or a rewind: the next checkpoint is a delta against Layers.
type TimelineHead struct {
	Sandbox    string
	Checkpoint string   // the checkpoint (its row may be gone since)
	Layers     []string // that checkpoint's view
}

// CheckpointStore holds checkpoints and timeline heads. Deleting a sandbox
// deletes both.
type CheckpointStore interface {
	// CreateCheckpoint inserts c with the next Seq of its sandbox and
	// returns it as stored; a duplicate id or non-empty name on the same
	// sandbox is AlreadyExists.
	CreateCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error)
	GetCheckpoint(ctx context.Context, id string) (Checkpoint, error)
	// ListCheckpoints lists a sandbox's checkpoints by seq ("" = every
	// sandbox's, by sandbox then seq).
	ListCheckpoints(ctx context.Context, sandboxID string) ([]Checkpoint, error)
	// CountCheckpoints counts owner's checkpoints (the snapshot quota counts them).
	CountCheckpoints(ctx context.Context, owner string) (int, error)
	DeleteCheckpoint(ctx context.Context, id string) error
	// SetTimelineHead replaces a sandbox's head; GetTimelineHead is
	// NotFound when none was set; ListTimelineHeads lists every one.
	SetTimelineHead(ctx context.Context, h TimelineHead) error
	GetTimelineHead(ctx context.Context, sandboxID string) (TimelineHead, error)
	ListTimelineHeads(ctx context.Context) ([]TimelineHead, error)
	DeleteTimelineHead(ctx context.Context, sandboxID string) error
}

const checkpointCols = `id, sandbox_id, owner, seq, name, layer, layers, prev, runtime, memory_path, mode, reason, bytes, entries, created_at`

// CreateCheckpoint inserts a checkpoint with the next seq of its sandbox.
func (s *imageTables) CreateCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error) {
	switch {
	case !snapshotIDRe.MatchString(c.ID):
		return Checkpoint{}, errs.Field("id", "checkpoint id must be 1-64 chars of [a-z0-9], got %q", c.ID)
	case c.Sandbox == "":
		return Checkpoint{}, errs.Field("sandbox", "must not be empty")
	case c.Owner == "":
		return Checkpoint{}, errs.Field("owner", "must not be empty")
	case c.Layer == "" || len(c.Layers) == 0 || c.Layers[0] != c.Layer:
		return Checkpoint{}, errs.Field("layers", "a checkpoint's view must start with its delta layer")
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = time.Now().UTC()
	}
	layers, err := sliceJSON(c.Layers)
	if err != nil {
		return Checkpoint{}, err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoints WHERE sandbox_id = ?`, c.Sandbox).Scan(&c.Seq); err != nil {
			return dbErr(err, "store: next checkpoint seq of %s", c.Sandbox)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO checkpoints (`+checkpointCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			c.ID, c.Sandbox, c.Owner, c.Seq, c.Name, c.Layer, layers, c.Prev, c.Runtime, c.MemoryPath, c.Mode, c.Reason,
			c.Bytes, c.Entries, toNanos(c.CreatedAt))
		if err != nil {
			return dbErr(err, "store: create checkpoint %s", c.ID)
		}
		return nil
	})
	if err != nil {
		return Checkpoint{}, err
	}
	return c, nil
}

func scanCheckpoint(sc scanner) (Checkpoint, error) {
	var (
		c       Checkpoint
		layers  sql.NullString
		created int64
	)
	if err := sc.Scan(&c.ID, &c.Sandbox, &c.Owner, &c.Seq, &c.Name, &c.Layer, &layers, &c.Prev, &c.Runtime,
		&c.MemoryPath, &c.Mode, &c.Reason, &c.Bytes, &c.Entries, &created); err != nil {
		return Checkpoint{}, err
	}
	c.CreatedAt = fromNanos(created)
	if err := fromJSON(layers, &c.Layers); err != nil {
		return Checkpoint{}, err
	}
	return c, nil
}

// GetCheckpoint returns one checkpoint by id.
func (s *imageTables) GetCheckpoint(ctx context.Context, id string) (Checkpoint, error) {
	c, err := scanCheckpoint(s.r.QueryRowContext(ctx, `SELECT `+checkpointCols+` FROM checkpoints WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Checkpoint{}, errs.E(errs.NotFound, "checkpoint %s not found", id)
	}
	if err != nil {
		return Checkpoint{}, dbErr(err, "store: get checkpoint %s", id)
	}
	return c, nil
}

// ListCheckpoints lists a sandbox's checkpoints by seq ("" = all).
func (s *imageTables) ListCheckpoints(ctx context.Context, sandboxID string) ([]Checkpoint, error) {
	q := `SELECT ` + checkpointCols + ` FROM checkpoints`
	var args []any
	if sandboxID != "" {
		q += ` WHERE sandbox_id = ?`
		args = append(args, sandboxID)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY sandbox_id, seq`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list checkpoints")
	}
	defer rows.Close()
	out := []Checkpoint{}
	for rows.Next() {
		c, err := scanCheckpoint(rows)
		if err != nil {
			return nil, dbErr(err, "store: list checkpoints")
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list checkpoints")
	}
	return out, nil
}

// CountCheckpoints counts owner's checkpoints.
func (s *imageTables) CountCheckpoints(ctx context.Context, owner string) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM checkpoints WHERE owner = ?`, owner).Scan(&n); err != nil {
		return 0, dbErr(err, "store: count checkpoints of %s", owner)
	}
	return n, nil
}

// DeleteCheckpoint removes a checkpoint's row.
func (s *imageTables) DeleteCheckpoint(ctx context.Context, id string) error {
	return s.deleteByKey(ctx, "checkpoints", "id", id, "checkpoint")
}

// SetTimelineHead replaces a sandbox's timeline head.
func (s *imageTables) SetTimelineHead(ctx context.Context, h TimelineHead) error {
	if h.Sandbox == "" {
		return errs.Field("sandbox", "must not be empty")
	}
	layers, err := sliceJSON(h.Layers)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO timeline_heads (sandbox_id, checkpoint, layers) VALUES (?, ?, ?)
			ON CONFLICT (sandbox_id) DO UPDATE SET checkpoint = excluded.checkpoint, layers = excluded.layers`,
			h.Sandbox, h.Checkpoint, layers)
		if err != nil {
			return dbErr(err, "store: set timeline head of %s", h.Sandbox)
		}
		return nil
	})
}

// GetTimelineHead returns a sandbox's timeline head (NotFound if none).
func (s *imageTables) GetTimelineHead(ctx context.Context, sandboxID string) (TimelineHead, error) {
	h := TimelineHead{Sandbox: sandboxID}
	var layers sql.NullString
	err := s.r.QueryRowContext(ctx, `SELECT checkpoint, layers FROM timeline_heads WHERE sandbox_id = ?`, sandboxID).Scan(&h.Checkpoint, &layers)
	if errors.Is(err, sql.ErrNoRows) {
		return TimelineHead{}, errs.E(errs.NotFound, "sandbox %s has no timeline head", sandboxID)
	}
	if err != nil {
		return TimelineHead{}, dbErr(err, "store: get timeline head of %s", sandboxID)
	}
	if err := fromJSON(layers, &h.Layers); err != nil {
		return TimelineHead{}, err
	}
	return h, nil
}

// ListTimelineHeads lists every sandbox's head, by sandbox.
func (s *imageTables) ListTimelineHeads(ctx context.Context) ([]TimelineHead, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT sandbox_id, checkpoint, layers FROM timeline_heads ORDER BY sandbox_id`)
	if err != nil {
		return nil, dbErr(err, "store: list timeline heads")
	}
	defer rows.Close()
	out := []TimelineHead{}
	for rows.Next() {
		var (
			h      TimelineHead
			layers sql.NullString
		)
		if err := rows.Scan(&h.Sandbox, &h.Checkpoint, &layers); err != nil {
			return nil, dbErr(err, "store: list timeline heads")
		}
		if err := fromJSON(layers, &h.Layers); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list timeline heads")
	}
	return out, nil
}

// DeleteTimelineHead removes a sandbox's head (NotFound if none).
func (s *imageTables) DeleteTimelineHead(ctx context.Context, sandboxID string) error {
	return s.deleteByKey(ctx, "timeline_heads", "sandbox_id", sandboxID, "timeline head")
}

// deleteTimeline removes a sandbox's checkpoints and head, in the
// transaction that deletes the sandbox.
func deleteTimeline(ctx context.Context, tx *sql.Tx, sandboxID string) error {
	for _, q := range []string{`DELETE FROM checkpoints WHERE sandbox_id = ?`, `DELETE FROM timeline_heads WHERE sandbox_id = ?`} {
		if _, err := tx.ExecContext(ctx, q, sandboxID); err != nil {
			return dbErr(err, "store: delete timeline of %s", sandboxID)
		}
	}
	return nil
}
