package store

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func (s *lifecycleTables) AppendEvent(ctx context.Context, ev sandbox.Event) (int64, error) {
	var seq int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		seq, err = appendEvent(ctx, tx, ev)
		return err
	})
	return seq, err
}

func appendEvent(ctx context.Context, tx *sql.Tx, ev sandbox.Event) (int64, error) {
	if ev.Type == "" {
		return 0, errs.Field("type", "must not be empty")
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	data, err := mapJSON(ev.Data)
	if err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO events
		(sandbox_id, owner, time, actor, type, from_state, to_state, reason, message, data)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		ev.SandboxID, ev.Owner, toNanos(ev.Time), ev.Actor, ev.Type, string(ev.From), string(ev.To),
		ev.Reason, ev.Message, data)
	if err != nil {
		return 0, dbErr(err, "store: append event for %s", ev.SandboxID)
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return 0, dbErr(err, "store: append event for %s", ev.SandboxID)
	}
	return seq, nil
}

func (s *lifecycleTables) ListEvents(ctx context.Context, f EventFilter) ([]sandbox.Event, error) {
	if f.Limit < 0 {
		return nil, errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	where, args := []string{"seq > ?"}, []any{f.AfterSeq}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if f.Owner != "" {
		where, args = append(where, "owner = ?"), append(args, f.Owner)
	}
	q := `SELECT seq, sandbox_id, owner, time, actor, type, from_state, to_state, reason, message, data
		FROM events WHERE ` + strings.Join(where, " AND ") + ` ORDER BY seq`
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list events")
	}
	defer rows.Close()
	var out []sandbox.Event
	for rows.Next() {
		var (
			ev       sandbox.Event
			t        int64
			from, to string
			data     sql.NullString
		)
		if err := rows.Scan(&ev.Seq, &ev.SandboxID, &ev.Owner, &t, &ev.Actor, &ev.Type, &from, &to,
			&ev.Reason, &ev.Message, &data); err != nil {
			return nil, dbErr(err, "store: list events")
		}
		ev.Time, ev.From, ev.To = fromNanos(t), sandbox.State(from), sandbox.State(to)
		if err := fromJSON(data, &ev.Data); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list events")
	}
	return out, nil
}
