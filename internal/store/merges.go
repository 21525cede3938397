package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Merge states. Planned and conflicted are open: a target has at most one
// open merge (the store refuses a second with AlreadyExists).
const (
	MergePlanned    = "planned"    // a clean plan, about to be (or being) applied
	MergeConflicted = "conflicted" // waiting for its conflicts to be resolved
	MergeApplied    = "applied"
	MergeAborted    = "aborted"
)

// Merge is one merge of a source sandbox's changes into a target sandbox
// (internal/merges). Plan and Result are the service's JSON, opaque here;
// the plan's conflicts are kept as MergeConflict rows, not in Plan.
type Merge struct {
	ID             string
	Owner          string
	Target         string
	Source         string
	BaseSnapshot   string // the fork point
	SourceSnapshot string // the capture of the source's upper (pinned while open)
	SourceLayer    string
	Strategy       string
	State          string
	Plan           []byte
	Result         []byte
	Reason         string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// Open says the merge still waits for resolution or apply.
func (m Merge) Open() bool { return m.State == MergePlanned || m.State == MergeConflicted }

// MergeConflict is one stored conflict of a merge: Data is the conflict
// (versions, merged text) as the service encodes it; Resolution is empty
// while unresolved.
type MergeConflict struct {
	MergeID    string
	ID         string
	Seq        int // order in the plan
	Path       string
	Kind       string
	Message    string
	Data       []byte
	Resolution []byte
}

const mergeCols = `id, owner, target, source, base_snapshot, source_snapshot, source_layer, strategy, state, plan_json, result_json, reason, created_at, updated_at`

// CreateMerge inserts a merge with its conflicts. A second open merge of
// the same target, or a duplicate id, is AlreadyExists.
func (s *imageTables) CreateMerge(ctx context.Context, m Merge, cs []MergeConflict) error {
	if !snapshotIDRe.MatchString(m.ID) {
		return errs.Field("id", "merge id must be 1-64 chars of [a-z0-9], got %q", m.ID)
	}
	if m.Target == "" || m.Owner == "" {
		return errs.Field("target", "a merge needs a target and an owner")
	}
	now := time.Now().UTC()
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = m.CreatedAt
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO merges (`+mergeCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			m.ID, m.Owner, m.Target, m.Source, m.BaseSnapshot, m.SourceSnapshot, m.SourceLayer, m.Strategy, m.State,
			string(m.Plan), string(m.Result), m.Reason, toNanos(m.CreatedAt), toNanos(m.UpdatedAt))
		if err != nil {
			return dbErr(err, "store: create merge %s into %s", m.ID, m.Target)
		}
		for i, c := range cs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO merge_conflicts
				(merge_id, conflict_id, seq, path, kind, message, data, resolution) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
				m.ID, c.ID, i, c.Path, c.Kind, c.Message, string(c.Data), string(c.Resolution)); err != nil {
				return dbErr(err, "store: create merge %s: conflict %s", m.ID, c.ID)
			}
		}
		return nil
	})
}

func scanMerge(sc scanner) (Merge, error) {
	var (
		m                Merge
		plan, result     string
		created, updated int64
	)
	if err := sc.Scan(&m.ID, &m.Owner, &m.Target, &m.Source, &m.BaseSnapshot, &m.SourceSnapshot, &m.SourceLayer,
		&m.Strategy, &m.State, &plan, &result, &m.Reason, &created, &updated); err != nil {
		return Merge{}, err
	}
	m.Plan, m.Result = []byte(plan), []byte(result)
	m.CreatedAt, m.UpdatedAt = fromNanos(created), fromNanos(updated)
	return m, nil
}

// GetMerge returns one merge by id.
func (s *imageTables) GetMerge(ctx context.Context, id string) (Merge, error) {
	m, err := scanMerge(s.r.QueryRowContext(ctx, `SELECT `+mergeCols+` FROM merges WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Merge{}, errs.E(errs.NotFound, "merge %s not found", id)
	}
	if err != nil {
		return Merge{}, dbErr(err, "store: get merge %s", id)
	}
	return m, nil
}

// ListMerges lists the merges into target ("" = every target), oldest first.
func (s *imageTables) ListMerges(ctx context.Context, target string) ([]Merge, error) {
	q := `SELECT ` + mergeCols + ` FROM merges`
	var args []any
	if target != "" {
		q += ` WHERE target = ?`
		args = append(args, target)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list merges")
	}
	defer rows.Close()
	out := []Merge{}
	for rows.Next() {
		m, err := scanMerge(rows)
		if err != nil {
			return nil, dbErr(err, "store: list merges")
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list merges")
	}
	return out, nil
}

// UpdateMerge stores a merge's state, plan, result and reason (UpdatedAt
// defaults to now). Leaving the open states is final: an applied or
// aborted merge is not changed again (Conflict).
func (s *imageTables) UpdateMerge(ctx context.Context, m Merge) error {
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = time.Now().UTC()
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE merges SET state = ?, plan_json = ?, result_json = ?, reason = ?, updated_at = ?
			WHERE id = ? AND state IN ('planned', 'conflicted')`,
			m.State, string(m.Plan), string(m.Result), m.Reason, toNanos(m.UpdatedAt), m.ID)
		if err != nil {
			return dbErr(err, "store: update merge %s", m.ID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return dbErr(err, "store: update merge %s", m.ID)
		} else if n == 1 {
			return nil
		}
		var state string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM merges WHERE id = ?`, m.ID).Scan(&state); errors.Is(err, sql.ErrNoRows) {
			return errs.E(errs.NotFound, "merge %s not found", m.ID)
		} else if err != nil {
			return dbErr(err, "store: update merge %s", m.ID)
		}
		return errs.E(errs.Conflict, "merge %s is %s; it can no longer change", m.ID, state)
	})
}

// ListMergeConflicts lists a merge's conflicts in plan order, resolved ones included.
func (s *imageTables) ListMergeConflicts(ctx context.Context, mergeID string) ([]MergeConflict, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT merge_id, conflict_id, seq, path, kind, message, data, resolution
		FROM merge_conflicts WHERE merge_id = ? ORDER BY seq`, mergeID)
	if err != nil {
		return nil, dbErr(err, "store: list conflicts of merge %s", mergeID)
	}
	defer rows.Close()
	out := []MergeConflict{}
	for rows.Next() {
		var c MergeConflict
		var data, res string
		if err := rows.Scan(&c.MergeID, &c.ID, &c.Seq, &c.Path, &c.Kind, &c.Message, &data, &res); err != nil {
			return nil, dbErr(err, "store: list conflicts of merge %s", mergeID)
		}
		c.Data, c.Resolution = []byte(data), []byte(res)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list conflicts of merge %s", mergeID)
	}
	return out, nil
}

// ResolveMergeConflict records a conflict's resolution and the merge's
// plan after it, in one transaction. An unknown conflict is NotFound, one
// already resolved or a merge no longer open is Conflict.
func (s *imageTables) ResolveMergeConflict(ctx context.Context, mergeID, conflictID string, resolution, plan []byte) error {
	if len(resolution) == 0 {
		return errs.Field("resolution", "must not be empty")
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		var prev string
		err := tx.QueryRowContext(ctx, `SELECT resolution FROM merge_conflicts WHERE merge_id = ? AND conflict_id = ?`,
			mergeID, conflictID).Scan(&prev)
		if errors.Is(err, sql.ErrNoRows) {
			return errs.E(errs.NotFound, "no conflict %s in merge %s", conflictID, mergeID)
		}
		if err != nil {
			return dbErr(err, "store: resolve %s", conflictID)
		}
		if prev != "" {
			return errs.E(errs.Conflict, "conflict %s is already resolved", conflictID)
		}
		res, err := tx.ExecContext(ctx, `UPDATE merges SET plan_json = ?, updated_at = ? WHERE id = ? AND state IN ('planned', 'conflicted')`,
			string(plan), toNanos(time.Now().UTC()), mergeID)
		if err != nil {
			return dbErr(err, "store: resolve %s", conflictID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return dbErr(err, "store: resolve %s", conflictID)
		} else if n != 1 {
			return errs.E(errs.Conflict, "merge %s is no longer open", mergeID)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE merge_conflicts SET resolution = ? WHERE merge_id = ? AND conflict_id = ?`,
			string(resolution), mergeID, conflictID); err != nil {
			return dbErr(err, "store: resolve %s", conflictID)
		}
		return nil
	})
}
