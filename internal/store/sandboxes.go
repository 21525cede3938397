package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// lifecycleTables owns the sandbox lifecycle's tables: sandboxes (the
// records and their state transitions), events (the append-only log every
// transition writes to in the same transaction), settings, and api_keys.
type lifecycleTables struct{ *conn }

const sandboxCols = `id, owner, template, template_id, runtime, state, reason, message,
	labels, env, cpu_millis, memory_mib, disk_mib, pids, created_at, started_at, expires_at,
	expiry_action, access_token, pause_requested, pause_actual, resumed_from, restore_count,
	auto_resume, attrs, version`

// sandboxArgs returns sb's column values in sandboxCols order.
func sandboxArgs(sb *sandbox.Sandbox) ([]any, error) {
	labels, err := mapJSON(sb.Labels)
	if err != nil {
		return nil, err
	}
	env, err := mapJSON(sb.Env)
	if err != nil {
		return nil, err
	}
	attrs, err := json.Marshal(sb.Attrs)
	if err != nil {
		return nil, err
	}
	return []any{sb.ID, sb.Owner, sb.Template, sb.TemplateID, sb.Runtime, string(sb.State), sb.Reason, sb.Message,
		labels, env, sb.Resources.CPUMillis, sb.Resources.MemoryMiB, sb.Resources.DiskMiB, sb.Resources.Pids,
		toNanos(sb.CreatedAt), toNanos(sb.StartedAt), toNanos(sb.ExpiresAt),
		string(sb.ExpiryAction), sb.AccessTokenHash, string(sb.PauseRequested), string(sb.PauseActual),
		string(sb.ResumedFrom), sb.RestoreCount, sb.AutoResume, string(attrs), sb.Version}, nil
}

func scanSandbox(sc scanner) (*sandbox.Sandbox, error) {
	var (
		sb                                 sandbox.Sandbox
		state, expiry, preq, pact, resumed string
		labels, env                        sql.NullString
		attrs                              string
		created, started, expires          int64
	)
	err := sc.Scan(&sb.ID, &sb.Owner, &sb.Template, &sb.TemplateID, &sb.Runtime, &state, &sb.Reason, &sb.Message,
		&labels, &env, &sb.Resources.CPUMillis, &sb.Resources.MemoryMiB, &sb.Resources.DiskMiB, &sb.Resources.Pids,
		&created, &started, &expires, &expiry, &sb.AccessTokenHash, &preq, &pact, &resumed, &sb.RestoreCount,
		&sb.AutoResume, &attrs, &sb.Version)
	if err != nil {
		return nil, err
	}
	sb.State = sandbox.State(state)
	sb.ExpiryAction = sandbox.ExpiryAction(expiry)
	sb.PauseRequested, sb.PauseActual, sb.ResumedFrom = sandbox.PauseMode(preq), sandbox.PauseMode(pact), sandbox.PauseMode(resumed)
	sb.CreatedAt, sb.StartedAt, sb.ExpiresAt = fromNanos(created), fromNanos(started), fromNanos(expires)
	for _, c := range []struct {
		col sql.NullString
		dst *map[string]string
	}{{labels, &sb.Labels}, {env, &sb.Env}} {
		if err := fromJSON(c.col, c.dst); err != nil {
			return nil, err
		}
	}
	if err := json.Unmarshal([]byte(attrs), &sb.Attrs); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "sandbox %s: attrs", sb.ID)
	}
	return &sb, nil
}

func validSandboxID(id string) error {
	if !sandbox.ValidID(id) {
		return errs.Field("id", "must be 1-64 lowercase letters and digits, got %q", id)
	}
	return nil
}

func (s *lifecycleTables) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	if err := validSandboxID(sb.ID); err != nil {
		return err
	}
	rec := *sb
	rec.Version = 1
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = time.Now().UTC()
	}
	args, err := sandboxArgs(&rec)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`) VALUES (`+placeholders(len(args))+`)`, args...)
		if err := dbErr(err, "store: create sandbox %s", sb.ID); errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "sandbox %s already exists", sb.ID)
		} else if err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	sb.Version, sb.CreatedAt = rec.Version, rec.CreatedAt
	return nil
}

func (s *lifecycleTables) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return getSandbox(ctx, s.r, id)
}

func (s *lifecycleTables) SandboxByTokenHash(ctx context.Context, hash string) (*sandbox.Sandbox, error) {
	if hash == "" {
		return nil, errs.E(errs.NotFound, "no sandbox has an empty access token")
	}
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE access_token = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.E(errs.NotFound, "no sandbox with this access token")
	}
	return sb, err
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getSandbox(ctx context.Context, q querier, id string) (*sandbox.Sandbox, error) {
	sb, err := scanSandbox(q.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.E(errs.NotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return nil, dbErr(err, "store: get sandbox %s", id)
	}
	return sb, nil
}

func (s *lifecycleTables) ListSandboxes(ctx context.Context, f SandboxFilter) ([]*sandbox.Sandbox, string, error) {
	var (
		where []string
		args  []any
	)
	if f.Owner != "" {
		where, args = append(where, "owner = ?"), append(args, f.Owner)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.Template != "" {
		where, args = append(where, "template = ?"), append(args, f.Template)
	}
	if !f.CreatedAfter.IsZero() {
		where, args = append(where, "created_at > ?"), append(args, toNanos(f.CreatedAfter))
	}
	if !f.ExpiresBy.IsZero() {
		where, args = append(where, "expires_at != 0 AND expires_at <= ?"), append(args, toNanos(f.ExpiresBy))
	}
	for _, k := range slices.Sorted(maps.Keys(f.Labels)) {
		where = append(where, "EXISTS (SELECT 1 FROM json_each(sandboxes.labels) WHERE key = ? AND value = ?)")
		args = append(args, k, f.Labels[k])
	}
	dir, cmp := "ASC", ">"
	switch f.Order {
	case "", OrderAsc:
	case OrderDesc:
		dir, cmp = "DESC", "<"
	default:
		return nil, "", errs.Field("order", "must be %q or %q, got %q", OrderAsc, OrderDesc, f.Order)
	}
	if f.After != "" {
		created, id, err := decodeCursor(f.After)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at, id) "+cmp+" (?, ?)")
		args = append(args, created, id)
	}
	if f.Limit < 0 {
		return nil, "", errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at " + dir + ", id " + dir
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit+1) // one extra row tells whether a next page exists
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", dbErr(err, "store: list sandboxes")
	}
	defer rows.Close()
	var out []*sandbox.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", dbErr(err, "store: list sandboxes")
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", dbErr(err, "store: list sandboxes")
	}
	var next string
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
		last := out[len(out)-1]
		next = encodeCursor(toNanos(last.CreatedAt), last.ID)
	}
	return out, next, nil
}

// A cursor is the (created_at, id) of the last item of a page, so pages stay
// stable while sandboxes are created or deleted between requests.
func encodeCursor(created int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(created, 10) + "." + id))
}

func decodeCursor(c string) (int64, string, error) {
	bad := errs.Field("after", "is not a cursor returned by a previous page")
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", bad
	}
	ts, id, ok := strings.Cut(string(b), ".")
	created, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || !sandbox.ValidID(id) {
		return 0, "", bad
	}
	return created, id, nil
}

func (s *lifecycleTables) UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	err := s.write(ctx, func(tx *sql.Tx) error {
		sb, err := getSandbox(ctx, tx, id)
		if err != nil {
			return err
		}
		read := sb.Version
		if err := fn(sb); err != nil {
			return err
		}
		if err := putSandbox(ctx, tx, id, read, sb); err != nil {
			return err
		}
		out = sb
		return nil
	})
	return out, err
}

// putSandbox writes sb over the row id, checking that the row still has
// the version it was read at, and sets sb.Version to the next version.
func putSandbox(ctx context.Context, tx *sql.Tx, id string, read int64, sb *sandbox.Sandbox) error {
	if sb.ID != id {
		return errs.Field("id", "cannot be changed (from %q to %q)", id, sb.ID)
	}
	sb.Version = read + 1
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	cols := strings.Split(sandboxCols, ",")
	set := make([]string, 0, len(cols))
	for _, c := range cols[1:] { // every column but id
		set = append(set, strings.TrimSpace(c)+" = ?")
	}
	res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET `+strings.Join(set, ", ")+` WHERE id = ? AND version = ?`,
		append(args[1:], id, read)...)
	if err != nil {
		return dbErr(err, "store: update sandbox %s", id)
	}
	if n, err := res.RowsAffected(); err != nil {
		return dbErr(err, "store: update sandbox %s", id)
	} else if n != 1 {
		return errs.E(errs.Conflict, "sandbox %s changed concurrently (version %d no longer current)", id, read)
	}
	return nil
}

func (s *lifecycleTables) DeleteSandbox(ctx context.Context, id string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
		if err != nil {
			return dbErr(err, "store: delete sandbox %s", id)
		}
		if n, err := res.RowsAffected(); err != nil {
			return dbErr(err, "store: delete sandbox %s", id)
		} else if n == 0 {
			return errs.E(errs.NotFound, "sandbox %s not found", id)
		}
		// The other groups' rows of this sandbox go in the same transaction,
		// through their files' tx functions; tasks, merges, notes and
		// activity go by ON DELETE CASCADE or trigger.
		if err := deleteLeases(ctx, tx, id); err != nil {
			return err
		}
		return deleteTimeline(ctx, tx, id)
	})
}

func (s *lifecycleTables) Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	err := s.write(ctx, func(tx *sql.Tx) (err error) {
		out, err = transitionTx(ctx, tx, id, to, ev, fn)
		return err
	})
	return out, err
}

// transitionTx is Transition in tx (TransitionLeases writes leases in the same one).
func transitionTx(ctx context.Context, tx *sql.Tx, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	sb, err := getSandbox(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	from, read := sb.State, sb.Version
	if err := sandbox.Transition(from, to); err != nil {
		return nil, err
	}
	if fn != nil {
		if err := fn(sb); err != nil {
			return nil, err
		}
	}
	sb.State = to
	if err := putSandbox(ctx, tx, id, read, sb); err != nil {
		return nil, err
	}
	ev.SandboxID, ev.Owner, ev.From, ev.To = sb.ID, sb.Owner, from, to
	if ev.Type == "" {
		ev.Type = "transition"
	}
	if _, err := appendEvent(ctx, tx, ev); err != nil {
		return nil, err
	}
	return sb, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
