package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Effect states.
const (
	EffectPending   = "pending"   // intent recorded, no outcome yet
	EffectCompleted = "completed" // an answer came back (any status)
	EffectUnknown   = "unknown"   // sending or reading failed mid-way
	// EffectWithdrawn: recorded, then not sent at all (no byte of it went
	// upstream: the upstream's TLS handshake, which ran alongside the
	// intent's commit, failed). It never happened: a repeat is sent.
	EffectWithdrawn = "withdrawn"
)

// Effect is one side effect in the ledger (internal/effects): the intent,
// recorded before the request is sent, then its outcome.
type Effect struct {
	ID         string
	Seq        int64 // assigned by RecordEffect
	Lineage    string
	SandboxID  string
	Owner      string
	Step       string
	Method     string
	Host       string
	Path       string
	BodySHA256 string
	BodySize   int64
	Key        string // the Idempotency-Key sent ("" = none)
	KeySource  string // "agent", "derived" or ""
	Identity   string // hash of (lineage, step, method, host, path, body)
	Secret     bool   // carried an injected secret
	State      string
	Status     int
	RespSize   int64
	Reason     string
	StartedAt  time.Time
	EndedAt    time.Time
	Replay     []byte // the recorded answer (opaque to the store); nil = not replayable
}

// EffectOutcome completes a pending effect.
type EffectOutcome struct {
	State    string // EffectCompleted, EffectUnknown or EffectWithdrawn
	Status   int
	RespSize int64
	Reason   string
	EndedAt  time.Time
	Replay   []byte
}

// EffectWrite is one write of a WriteEffects batch: an intent to insert
// (Record), or the outcome (Finish) of the pending effect ID.
type EffectWrite struct {
	Record *Effect
	ID     string
	Finish *EffectOutcome
}

// EffectFilter selects one sandbox's own effects; Since/Until bound
// StartedAt (exclusive / inclusive; zero = unbounded).
type EffectFilter struct {
	SandboxID string
	Since     time.Time
	Until     time.Time
	Limit     int // 0 = no limit
}

// RestoreWindow is a span of a sandbox's past that a restore undid: the
// effects it made between PointAt and At are no longer in its state.
type RestoreWindow struct {
	PointAt time.Time `json:"point_at"`
	At      time.Time `json:"at"`
}

// EffectScope is a sandbox's place in its lineage for the ledger.
type EffectScope struct {
	SandboxID string
	Lineage   string // the lineage root
	Parent    string // the fork parent or snapshot source ("" = none)
	PointAt   time.Time
	Windows   []RestoreWindow
}

// EffectStore is the side-effect ledger's storage. Deleting a sandbox
// keeps its effects and scope (a descendant's retry still finds them).
type EffectStore interface {
	// RecordEffect inserts an intent (State pending) and returns it with Seq.
	RecordEffect(ctx context.Context, e Effect) (Effect, error)
	// FinishEffect sets the outcome of a pending effect; NotFound if there
	// is none pending with that id.
	FinishEffect(ctx context.Context, id string, o EffectOutcome) error
	// WriteEffects applies intents and outcomes in one commit; errs[i] is
	// write i's own error (AlreadyExists, NotFound, InvalidArgument), err
	// the commit's (then none was applied). Record.Seq is set.
	WriteEffects(ctx context.Context, ws []EffectWrite) (errs []error, err error)
	GetEffect(ctx context.Context, id string) (Effect, error)
	// FindEffects returns the newest effects of lineage with key (when not
	// "") or else identity, at most limit, without their Replay.
	FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]Effect, error)
	// ListEffects lists a sandbox's own effects by Seq, without Replay.
	ListEffects(ctx context.Context, f EffectFilter) ([]Effect, error)
	// CountEffects counts a sandbox's own effects and the bytes of their replays.
	CountEffects(ctx context.Context, sandboxID string) (n int, replayBytes int64, err error)
	// PutEffectScope replaces a sandbox's scope; GetEffectScope is
	// NotFound when none was put.
	PutEffectScope(ctx context.Context, sc EffectScope) error
	GetEffectScope(ctx context.Context, sandboxID string) (EffectScope, error)
}

const effectCols = `id, seq, lineage, sandbox_id, owner, step, method, host, path, body_sha256, body_size, idem_key, key_source,
	identity, secret, state, status, resp_size, reason, started_at, ended_at`

// RecordEffect inserts an effect's intent.
func (s *stateTables) RecordEffect(ctx context.Context, e Effect) (Effect, error) {
	if err := checkEffect(&e); err != nil {
		return Effect{}, err
	}
	err := s.write(ctx, func(tx *sql.Tx) error { return insertEffect(ctx, tx, &e) })
	if err != nil {
		return Effect{}, err
	}
	return e, nil
}

// checkEffect validates an intent and fills its defaults.
func checkEffect(e *Effect) error {
	switch {
	case e.ID == "":
		return errs.Field("id", "must not be empty")
	case e.SandboxID == "" || e.Lineage == "":
		return errs.Field("sandbox", "an effect needs its sandbox and lineage")
	}
	if e.StartedAt.IsZero() {
		e.StartedAt = time.Now().UTC()
	}
	e.State = EffectPending
	return nil
}

func insertEffect(ctx context.Context, tx *sql.Tx, e *Effect) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO effects (id, lineage, sandbox_id, owner, step, method, host, path,
		body_sha256, body_size, idem_key, key_source, identity, secret, state, status, resp_size, reason, started_at, ended_at, replay)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, '', ?, 0, NULL)`,
		e.ID, e.Lineage, e.SandboxID, e.Owner, e.Step, e.Method, e.Host, e.Path, e.BodySHA256, e.BodySize,
		e.Key, e.KeySource, e.Identity, boolInt(e.Secret), e.State, toNanos(e.StartedAt))
	if err != nil {
		return dbErr(err, "store: record effect %s", e.ID)
	}
	e.Seq, err = res.LastInsertId()
	return err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FinishEffect records an outcome.
func (s *stateTables) FinishEffect(ctx context.Context, id string, o EffectOutcome) error {
	if err := checkOutcome(o); err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error { return finishEffect(ctx, tx, id, o) })
}

func checkOutcome(o EffectOutcome) error {
	if o.State != EffectCompleted && o.State != EffectUnknown && o.State != EffectWithdrawn {
		return errs.Field("state", "must be %s, %s or %s, got %q", EffectCompleted, EffectUnknown, EffectWithdrawn, o.State)
	}
	return nil
}

func finishEffect(ctx context.Context, tx *sql.Tx, id string, o EffectOutcome) error {
	var replay any
	if o.Replay != nil {
		replay = o.Replay
	}
	res, err := tx.ExecContext(ctx, `UPDATE effects SET state = ?, status = ?, resp_size = ?, reason = ?, ended_at = ?, replay = ?
		WHERE id = ? AND state = ?`, o.State, o.Status, o.RespSize, o.Reason, toNanos(o.EndedAt), replay, id, EffectPending)
	if err != nil {
		return dbErr(err, "store: finish effect %s", id)
	}
	if n, err := res.RowsAffected(); err != nil {
		return dbErr(err, "store: finish effect %s", id)
	} else if n == 0 {
		return errs.E(errs.NotFound, "no pending effect %s", id)
	}
	return nil
}

// WriteEffects applies a batch of intents and outcomes in one transaction:
// one commit (one fsync) for all of them. A write's own failure
// (validation, a duplicate id, no pending effect to finish) is its entry
// in the returned slice and does not stop the others (SQLite rolls back
// just the failed statement); err is the transaction's — then nothing of
// the batch was applied.
func (s *stateTables) WriteEffects(ctx context.Context, ws []EffectWrite) ([]error, error) {
	out := make([]error, len(ws))
	err := s.write(ctx, func(tx *sql.Tx) error {
		for i := range ws {
			w := &ws[i]
			switch {
			case w.Record != nil && w.Finish != nil:
				out[i] = errs.Field("write", "an intent or an outcome, not both")
			case w.Record != nil:
				if out[i] = checkEffect(w.Record); out[i] == nil {
					out[i] = insertEffect(ctx, tx, w.Record)
				}
			case w.Finish != nil:
				if out[i] = checkOutcome(*w.Finish); out[i] == nil {
					out[i] = finishEffect(ctx, tx, w.ID, *w.Finish)
				}
			default:
				out[i] = errs.Field("write", "neither an intent nor an outcome")
			}
			if e := out[i]; e != nil && !errs.Is(e, errs.AlreadyExists) && !errs.Is(e, errs.NotFound) && !errs.Is(e, errs.InvalidArgument) {
				return e // not this write's own fault: the whole batch fails
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func scanEffect(sc scanner, withReplay bool) (Effect, error) {
	var (
		e              Effect
		secret         int
		started, ended int64
		replay         []byte
		dst            = []any{&e.ID, &e.Seq, &e.Lineage, &e.SandboxID, &e.Owner, &e.Step, &e.Method, &e.Host, &e.Path, &e.BodySHA256, &e.BodySize, &e.Key, &e.KeySource, &e.Identity, &secret, &e.State, &e.Status, &e.RespSize, &e.Reason, &started, &ended}
	)
	if withReplay {
		dst = append(dst, &replay)
	}
	if err := sc.Scan(dst...); err != nil {
		return Effect{}, err
	}
	e.Secret, e.StartedAt, e.EndedAt = secret != 0, fromNanos(started), fromNanos(ended)
	if len(replay) > 0 {
		e.Replay = replay
	}
	return e, nil
}

// GetEffect returns one effect with its replay.
func (s *stateTables) GetEffect(ctx context.Context, id string) (Effect, error) {
	e, err := scanEffect(s.r.QueryRowContext(ctx, `SELECT `+effectCols+`, replay FROM effects WHERE id = ?`, id), true)
	if errors.Is(err, sql.ErrNoRows) {
		return Effect{}, errs.E(errs.NotFound, "effect %s not found", id)
	}
	if err != nil {
		return Effect{}, dbErr(err, "store: get effect %s", id)
	}
	return e, nil
}

func (s *stateTables) queryEffects(ctx context.Context, q string, args ...any) ([]Effect, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list effects")
	}
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		e, err := scanEffect(rows, false)
		if err != nil {
			return nil, dbErr(err, "store: list effects")
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list effects")
	}
	return out, nil
}

// FindEffects returns the newest matching effects of a lineage.
func (s *stateTables) FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]Effect, error) {
	if limit <= 0 {
		limit = 16
	}
	if key != "" {
		return s.queryEffects(ctx, `SELECT `+effectCols+` FROM effects WHERE lineage = ? AND idem_key = ? AND idem_key != '' ORDER BY seq DESC LIMIT ?`, lineage, key, limit)
	}
	return s.queryEffects(ctx, `SELECT `+effectCols+` FROM effects WHERE lineage = ? AND identity = ? ORDER BY seq DESC LIMIT ?`, lineage, identity, limit)
}

// ListEffects lists a sandbox's own effects.
func (s *stateTables) ListEffects(ctx context.Context, f EffectFilter) ([]Effect, error) {
	var where []string
	var args []any
	where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	if !f.Since.IsZero() {
		where, args = append(where, "started_at > ?"), append(args, toNanos(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = append(where, "started_at <= ?"), append(args, toNanos(f.Until))
	}
	q := `SELECT ` + effectCols + ` FROM effects WHERE ` + strings.Join(where, " AND ") + ` ORDER BY seq`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	return s.queryEffects(ctx, q, args...)
}

// CountEffects counts a sandbox's own effects and their replay bytes.
func (s *stateTables) CountEffects(ctx context.Context, sandboxID string) (int, int64, error) {
	var n int
	var b int64
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(LENGTH(replay)), 0) FROM effects WHERE sandbox_id = ?`, sandboxID).Scan(&n, &b)
	if err != nil {
		return 0, 0, dbErr(err, "store: count effects of %s", sandboxID)
	}
	return n, b, nil
}

// PutEffectScope replaces a sandbox's scope.
func (s *stateTables) PutEffectScope(ctx context.Context, sc EffectScope) error {
	if sc.SandboxID == "" || sc.Lineage == "" {
		return errs.Field("sandbox", "a scope needs its sandbox and lineage")
	}
	var windows any
	if len(sc.Windows) > 0 {
		b, err := json.Marshal(sc.Windows)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "store: encode restore windows")
		}
		windows = string(b)
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effect_scopes (sandbox_id, lineage, parent, point_at, windows) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id) DO UPDATE SET lineage = excluded.lineage, parent = excluded.parent,
			point_at = excluded.point_at, windows = excluded.windows`,
			sc.SandboxID, sc.Lineage, sc.Parent, toNanos(sc.PointAt), windows)
		if err != nil {
			return dbErr(err, "store: put effect scope of %s", sc.SandboxID)
		}
		return nil
	})
}

// GetEffectScope returns a sandbox's scope.
func (s *stateTables) GetEffectScope(ctx context.Context, sandboxID string) (EffectScope, error) {
	var (
		sc      EffectScope
		point   int64
		windows sql.NullString
	)
	err := s.r.QueryRowContext(ctx, `SELECT sandbox_id, lineage, parent, point_at, windows FROM effect_scopes WHERE sandbox_id = ?`, sandboxID).
		Scan(&sc.SandboxID, &sc.Lineage, &sc.Parent, &point, &windows)
	if errors.Is(err, sql.ErrNoRows) {
		return EffectScope{}, errs.E(errs.NotFound, "no effect scope for %s", sandboxID)
	}
	if err != nil {
		return EffectScope{}, dbErr(err, "store: get effect scope of %s", sandboxID)
	}
	sc.PointAt = fromNanos(point)
	if err := fromJSON(windows, &sc.Windows); err != nil {
		return EffectScope{}, err
	}
	return sc, nil
}
