package store

import (
	"context"
	"database/sql"

	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// activityKindSQL classifies an events row (NEW) as an activity kind.
const activityKindSQL = `CASE
		WHEN NEW.type = 'transition' AND NEW.to_state = 'paused' THEN 'pause'
		WHEN NEW.type = 'transition' AND NEW.to_state = 'running' AND NEW.from_state = 'resuming' THEN 'resume'
		WHEN NEW.type IN ('reaper', 'reaper_failed') THEN 'reaper'
		ELSE 'lifecycle' END`

// activityModesSQL is what a pause or resume row keeps of the sandbox row s.
const activityModesSQL = `CASE WHEN NEW.type = 'transition' AND (NEW.to_state = 'paused' OR NEW.from_state = 'resuming')
		THEN json_object('requested', s.pause_requested, 'mode', s.pause_actual,
			'resumed_from', s.resumed_from, 'restore_count', s.restore_count) END`

var activitySchema = `
CREATE TABLE activity (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL,
	time       INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	actor      TEXT NOT NULL,
	summary    TEXT NOT NULL,
	data       TEXT,                       -- JSON owned by internal/activity, or NULL
	event_seq  INTEGER NOT NULL DEFAULT 0, -- the events row of a lifecycle/pause/resume/reaper entry
	egress_seq INTEGER NOT NULL DEFAULT 0  -- the egress_log row of an egress entry
) STRICT;
CREATE INDEX activity_sandbox ON activity (sandbox_id, seq);

CREATE TRIGGER activity_events AFTER INSERT ON events
WHEN EXISTS (SELECT 1 FROM sandboxes WHERE id = NEW.sandbox_id)
BEGIN
	INSERT INTO activity (sandbox_id, time, kind, actor, summary, data, event_seq)
	SELECT NEW.sandbox_id, NEW.time, ` + activityKindSQL + `, NEW.actor, '', ` + activityModesSQL + `, NEW.seq
	FROM sandboxes s WHERE s.id = NEW.sandbox_id;
END;

CREATE TRIGGER activity_egress AFTER INSERT ON egress_log
WHEN EXISTS (SELECT 1 FROM sandboxes WHERE id = NEW.sandbox_id)
BEGIN
	INSERT INTO activity (sandbox_id, time, kind, actor, summary, egress_seq)
	VALUES (NEW.sandbox_id, NEW.time, 'egress', 'egress', '', NEW.seq);
END;

CREATE TRIGGER activity_sandbox_deleted AFTER DELETE ON sandboxes
BEGIN
	DELETE FROM activity WHERE sandbox_id = OLD.id;
END;

INSERT INTO activity (sandbox_id, time, kind, actor, summary, event_seq)
SELECT e.sandbox_id, e.time, CASE
		WHEN e.type = 'transition' AND e.to_state = 'paused' THEN 'pause'
		WHEN e.type = 'transition' AND e.to_state = 'running' AND e.from_state = 'resuming' THEN 'resume'
		WHEN e.type IN ('reaper', 'reaper_failed') THEN 'reaper'
		ELSE 'lifecycle' END, e.actor, '', e.seq
FROM events e WHERE e.sandbox_id IN (SELECT id FROM sandboxes) ORDER BY e.seq;
`

// ActivityEntry is one row of a sandbox's activity timeline. A recorded
// entry carries Summary and Data (JSON of internal/activity's own type,
// opaque here); a lifecycle, pause, resume or reaper entry carries the
// event it points at (Event) and, for pause and resume, Data holds the
// sandbox's modes at that moment; an egress entry carries its egress log row.
type ActivityEntry struct {
	Seq       int64 // assigned by the store, increasing
	SandboxID string
	Time      time.Time
	Kind      string
	Actor     string
	Summary   string
	Data      []byte
	Event     *sandbox.Event // read only
	Egress    *EgressEntry   // read only
}

// ActivityFilter selects one sandbox's entries; Kinds empty = every kind.
type ActivityFilter struct {
	SandboxID string
	AfterSeq  int64
	Kinds     []string
	Limit     int // 0 means no limit
}

// AppendActivity stores recorded entries in one transaction. Entries of a
// sandbox whose row does not exist (deleted meanwhile) are dropped, so a
// late write cannot outlive the sandbox.
func (s *meteringTables) AppendActivity(ctx context.Context, entries []ActivityEntry) error {
	for _, e := range entries {
		switch {
		case e.SandboxID == "":
			return errs.Field("sandbox_id", "must not be empty")
		case e.Kind == "":
			return errs.Field("kind", "must not be empty")
		}
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO activity (sandbox_id, time, kind, actor, summary, data)
			SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`)
		if err != nil {
			return dbErr(err, "store: append activity")
		}
		defer stmt.Close()
		for _, e := range entries {
			if e.Time.IsZero() {
				e.Time = time.Now()
			}
			var data any
			if e.Data != nil {
				data = string(e.Data)
			}
			if _, err := stmt.ExecContext(ctx, e.SandboxID, toNanos(e.Time), e.Kind, e.Actor, e.Summary, data, e.SandboxID); err != nil {
				return dbErr(err, "store: append activity")
			}
		}
		return nil
	})
}

// ListActivity returns a sandbox's entries in ascending Seq order, with
// the events and egress rows they point at joined in.
func (s *meteringTables) ListActivity(ctx context.Context, f ActivityFilter) ([]ActivityEntry, error) {
	if f.SandboxID == "" {
		return nil, errs.Field("sandbox_id", "must not be empty")
	}
	if f.Limit < 0 {
		return nil, errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	q := `SELECT a.seq, a.sandbox_id, a.time, a.kind, a.actor, a.summary, a.data,
		e.seq, e.owner, e.time, e.actor, e.type, e.from_state, e.to_state, e.reason, e.message, e.data,
		g.seq, g.owner, g.time, g.proto, g.dst_ip, g.dst_port, g.host, g.rule, g.verdict, g.reason,
		g.intercepted, g.bytes_out, g.bytes_in, g.duration_ns
		FROM activity a
		LEFT JOIN events e ON a.event_seq != 0 AND e.seq = a.event_seq
		LEFT JOIN egress_log g ON a.egress_seq != 0 AND g.seq = a.egress_seq
		WHERE a.sandbox_id = ? AND a.seq > ?`
	args := []any{f.SandboxID, f.AfterSeq}
	if len(f.Kinds) > 0 {
		q += ` AND a.kind IN (` + placeholders(len(f.Kinds)) + `)`
		for _, k := range f.Kinds {
			args = append(args, k)
		}
	}
	q += ` ORDER BY a.seq`
	if f.Limit > 0 {
		q, args = q+` LIMIT ?`, append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list activity")
	}
	defer rows.Close()
	var out []ActivityEntry
	for rows.Next() {
		var (
			a    ActivityEntry
			t    int64
			data sql.NullString
			// the joined event
			eSeq, eTime                       sql.NullInt64
			eOwner, eActor, eType, eFrom, eTo sql.NullString
			eReason, eMsg, eData              sql.NullString
			gSeq, gTime, gPort, gInt          sql.NullInt64
			gOut, gIn, gDur                   sql.NullInt64
			gOwner, gProto, gIP, gHost, gRule sql.NullString
			gVerdict, gReason                 sql.NullString
		)
		if err := rows.Scan(&a.Seq, &a.SandboxID, &t, &a.Kind, &a.Actor, &a.Summary, &data,
			&eSeq, &eOwner, &eTime, &eActor, &eType, &eFrom, &eTo, &eReason, &eMsg, &eData,
			&gSeq, &gOwner, &gTime, &gProto, &gIP, &gPort, &gHost, &gRule, &gVerdict, &gReason,
			&gInt, &gOut, &gIn, &gDur); err != nil {
			return nil, dbErr(err, "store: list activity")
		}
		a.Time = fromNanos(t)
		if data.Valid {
			a.Data = []byte(data.String)
		}
		if eSeq.Valid {
			ev := &sandbox.Event{Seq: eSeq.Int64, SandboxID: a.SandboxID, Owner: eOwner.String, Time: fromNanos(eTime.Int64),
				Actor: eActor.String, Type: eType.String, From: sandbox.State(eFrom.String), To: sandbox.State(eTo.String),
				Reason: eReason.String, Message: eMsg.String}
			if err := fromJSON(eData, &ev.Data); err != nil {
				return nil, err
			}
			a.Event = ev
		}
		if gSeq.Valid {
			a.Egress = &EgressEntry{Seq: gSeq.Int64, SandboxID: a.SandboxID, Owner: gOwner.String, Time: fromNanos(gTime.Int64),
				Proto: gProto.String, DstIP: gIP.String, DstPort: int(gPort.Int64), Host: gHost.String, Rule: gRule.String,
				Verdict: gVerdict.String, Reason: gReason.String, Intercepted: gInt.Int64 != 0, BytesOut: gOut.Int64,
				BytesIn: gIn.Int64, Duration: time.Duration(gDur.Int64)}
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list activity")
	}
	return out, nil
}

// PruneActivity keeps the newest keep entries of a sandbox and deletes
// the rest, returning how many it deleted.
func (s *meteringTables) PruneActivity(ctx context.Context, sandboxID string, keep int) (int64, error) {
	if keep < 1 {
		return 0, errs.Field("keep", "must be at least 1, got %d", keep)
	}
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM activity WHERE sandbox_id = ? AND seq <=
			(SELECT seq FROM activity WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, sandboxID, sandboxID, keep)
		if err != nil {
			return dbErr(err, "store: prune activity of %s", sandboxID)
		}
		n, err = res.RowsAffected()
		return dbErr(err, "store: prune activity of %s", sandboxID)
	})
	return n, err
}

// ActivityTouched counts, per sandbox, the entries after seq (what a
// pruner must look at), and returns the largest seq there is.
func (s *meteringTables) ActivityTouched(ctx context.Context, afterSeq int64) (map[string]int64, int64, error) {
	var last sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT MAX(seq) FROM activity`).Scan(&last); err != nil {
		return nil, 0, dbErr(err, "store: activity touched")
	}
	if !last.Valid || last.Int64 <= afterSeq {
		return nil, afterSeq, nil
	}
	rows, err := s.r.QueryContext(ctx, `SELECT sandbox_id, COUNT(*) FROM activity WHERE seq > ? AND seq <= ? GROUP BY sandbox_id`,
		afterSeq, last.Int64)
	if err != nil {
		return nil, 0, dbErr(err, "store: activity touched")
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, 0, dbErr(err, "store: activity touched")
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, 0, dbErr(err, "store: activity touched")
	}
	return out, last.Int64, nil
}
