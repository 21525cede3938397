package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// EgressEntry is one persisted egress decision: a connection or DNS answer a
// sandbox's policy allowed or denied (see egress.Decision).
type EgressEntry struct {
	Seq         int64 // assigned by AppendEgress, increasing
	SandboxID   string
	Owner       string
	Time        time.Time
	Proto       string // "tcp" or "dns"
	DstIP       string
	DstPort     int
	Host        string
	Rule        string
	Verdict     string // "allow" or "deny"
	Reason      string
	Intercepted bool
	BytesOut    int64
	BytesIn     int64
	Duration    time.Duration
}

// EgressFilter selects egress entries; zero fields match everything.
type EgressFilter struct {
	SandboxID string
	AfterSeq  int64
	Limit     int // 0 means no limit
}

// Secret is a credential an owner can grant to sandboxes. Sealed is the
// value encrypted by the daemon; the store never sees the plaintext.
type Secret struct {
	Owner     string
	Name      string
	Host      string
	Header    string // header template, e.g. "Authorization: Bearer {{value}}"
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// AppendEgress stores entries in one transaction (Time defaults to now).
func (s *meteringTables) AppendEgress(ctx context.Context, entries []EgressEntry) error {
	for _, e := range entries {
		if e.SandboxID == "" {
			return errs.Field("sandbox_id", "must not be empty")
		}
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO egress_log (sandbox_id, owner, time, proto, dst_ip, dst_port,
			host, rule, verdict, reason, intercepted, bytes_out, bytes_in, duration_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return dbErr(err, "store: append egress")
		}
		defer stmt.Close()
		for _, e := range entries {
			if e.Time.IsZero() {
				e.Time = time.Now()
			}
			if _, err := stmt.ExecContext(ctx, e.SandboxID, e.Owner, toNanos(e.Time), e.Proto, e.DstIP, e.DstPort,
				e.Host, e.Rule, e.Verdict, e.Reason, e.Intercepted, e.BytesOut, e.BytesIn, int64(e.Duration)); err != nil {
				return dbErr(err, "store: append egress")
			}
		}
		return nil
	})
}

// ListEgress returns matching entries in ascending Seq order.
func (s *meteringTables) ListEgress(ctx context.Context, f EgressFilter) ([]EgressEntry, error) {
	q := `SELECT seq, sandbox_id, owner, time, proto, dst_ip, dst_port, host, rule, verdict, reason,
		intercepted, bytes_out, bytes_in, duration_ns FROM egress_log WHERE seq > ?`
	args := []any{f.AfterSeq}
	if f.SandboxID != "" {
		q, args = q+` AND sandbox_id = ?`, append(args, f.SandboxID)
	}
	q += ` ORDER BY seq`
	if f.Limit > 0 {
		q, args = q+` LIMIT ?`, append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list egress")
	}
	defer rows.Close()
	var out []EgressEntry
	for rows.Next() {
		var e EgressEntry
		var t, dur int64
		if err := rows.Scan(&e.Seq, &e.SandboxID, &e.Owner, &t, &e.Proto, &e.DstIP, &e.DstPort, &e.Host, &e.Rule,
			&e.Verdict, &e.Reason, &e.Intercepted, &e.BytesOut, &e.BytesIn, &dur); err != nil {
			return nil, dbErr(err, "store: list egress")
		}
		e.Time, e.Duration = fromNanos(t), time.Duration(dur)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list egress")
	}
	return out, nil
}

// PutSecret inserts or replaces the secret (Owner, Name). CreatedAt is kept
// from an existing row; UpdatedAt is set to now when zero.
func (s *meteringTables) PutSecret(ctx context.Context, sec Secret) (Secret, error) {
	switch {
	case sec.Owner == "":
		return Secret{}, errs.Field("owner", "must not be empty")
	case sec.Name == "":
		return Secret{}, errs.Field("name", "must not be empty")
	case sec.Host == "":
		return Secret{}, errs.Field("host", "must not be empty")
	case len(sec.Sealed) == 0:
		return Secret{}, errs.Field("value", "must not be empty")
	}
	now := time.Now().UTC()
	if sec.UpdatedAt.IsZero() {
		sec.UpdatedAt = now
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		var created int64
		err := tx.QueryRowContext(ctx, `SELECT created_at FROM secrets WHERE owner = ? AND name = ?`, sec.Owner, sec.Name).Scan(&created)
		switch {
		case err == nil:
			sec.CreatedAt = fromNanos(created)
		case errors.Is(err, sql.ErrNoRows):
			if sec.CreatedAt.IsZero() {
				sec.CreatedAt = now
			}
		default:
			return dbErr(err, "store: put secret %s", sec.Name)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO secrets (owner, name, host, header, sealed, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, name) DO UPDATE SET host = excluded.host,
			header = excluded.header, sealed = excluded.sealed, updated_at = excluded.updated_at`,
			sec.Owner, sec.Name, sec.Host, sec.Header, sec.Sealed, toNanos(sec.CreatedAt), toNanos(sec.UpdatedAt))
		return dbErr(err, "store: put secret %s", sec.Name)
	})
	if err != nil {
		return Secret{}, err
	}
	return sec, nil
}

const secretCols = `owner, name, host, header, sealed, created_at, updated_at`

func scanSecret(sc scanner) (Secret, error) {
	var sec Secret
	var created, updated int64
	if err := sc.Scan(&sec.Owner, &sec.Name, &sec.Host, &sec.Header, &sec.Sealed, &created, &updated); err != nil {
		return Secret{}, err
	}
	sec.CreatedAt, sec.UpdatedAt = fromNanos(created), fromNanos(updated)
	return sec, nil
}

// GetSecret returns NotFound for an unknown (owner, name).
func (s *meteringTables) GetSecret(ctx context.Context, owner, name string) (Secret, error) {
	sec, err := scanSecret(s.r.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE owner = ? AND name = ?`, owner, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, errs.E(errs.NotFound, "secret %q not found", name)
	}
	if err != nil {
		return Secret{}, dbErr(err, "store: get secret %s", name)
	}
	return sec, nil
}

// ListSecrets lists owner's secrets ("" = every owner) ordered by owner, name.
func (s *meteringTables) ListSecrets(ctx context.Context, owner string) ([]Secret, error) {
	q, args := `SELECT `+secretCols+` FROM secrets`, []any{}
	if owner != "" {
		q, args = q+` WHERE owner = ?`, append(args, owner)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY owner, name`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list secrets")
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, dbErr(err, "store: list secrets")
		}
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list secrets")
	}
	return out, nil
}

// DeleteSecret returns NotFound for an unknown (owner, name).
func (s *meteringTables) DeleteSecret(ctx context.Context, owner, name string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE owner = ? AND name = ?`, owner, name)
		if err != nil {
			return dbErr(err, "store: delete secret %s", name)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errs.E(errs.NotFound, "secret %q not found", name)
		}
		return nil
	})
}
