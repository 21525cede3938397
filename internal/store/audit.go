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

// AuditStore holds the audit chain (internal/audit): rows appended with the
// seq and hashes their writer computed, and the chain's head. Rows are never
// updated or deleted, not even with their sandbox.
type AuditStore interface {
	// AppendAudit stores entries (consecutive seqs continuing the stored
	// chain: the first is the stored last seq + 1) and replaces the head,
	// in one transaction. A gap or an overlap with the stored rows is a
	// Conflict and writes nothing.
	AppendAudit(ctx context.Context, entries []AuditEntry, head AuditHead) error
	// AuditHead returns the stored head (NotFound before the first append).
	AuditHead(ctx context.Context) (AuditHead, error)
	// AuditLast returns the row with the highest seq (NotFound when empty).
	AuditLast(ctx context.Context) (AuditEntry, error)
	// ListAudit returns matching entries in ascending seq order.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
}

// AuditEntry is one link of the audit chain. Hash is the hex SHA-256 of
// PrevHash and the entry's canonical encoding (audit.Canonical).
type AuditEntry struct {
	Seq       int64
	Time      time.Time
	Actor     string
	Action    string
	SandboxID string
	Owner     string
	Data      map[string]string
	PrevHash  string
	Hash      string
	MAC       string // the audit key's MAC over (Seq, Hash)
	// DataRaw is the data column as stored (ListAudit fills it): the
	// verifier reports a column that is not a JSON object of strings.
	DataRaw string
}

// AuditHead is the chain's last link and the MAC over it.
type AuditHead struct {
	Seq  int64
	Hash string
	MAC  string
}

// AuditFilter selects audit entries; zero fields match everything.
type AuditFilter struct {
	AfterSeq  int64
	Since     time.Time // entries at or after
	SandboxID string
	Owner     string
	Limit     int // 0 = no limit
}

// AppendAudit stores entries and the new head in one transaction.
func (s *stateTables) AppendAudit(ctx context.Context, entries []AuditEntry, head AuditHead) error {
	if len(entries) == 0 {
		return nil
	}
	for i, e := range entries {
		if e.Seq != entries[0].Seq+int64(i) {
			return errs.Field("seq", "audit entries must have consecutive seqs, got %d after %d", e.Seq, entries[0].Seq+int64(i)-1)
		}
	}
	if last := entries[len(entries)-1]; head.Seq != last.Seq || head.Hash != last.Hash {
		return errs.Field("head", "must be the last entry (seq %d), got seq %d", last.Seq, head.Seq)
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		var max sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT MAX(seq) FROM audit`).Scan(&max); err != nil {
			return dbErr(err, "store: append audit")
		}
		if max.Int64+1 != entries[0].Seq {
			return errs.E(errs.Conflict, "store: audit chain ends at seq %d, cannot append seq %d", max.Int64, entries[0].Seq)
		}
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO audit (seq, time, actor, action, sandbox_id, owner, data, prev_hash, hash, mac)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return dbErr(err, "store: append audit")
		}
		defer stmt.Close()
		for _, e := range entries {
			data := e.DataRaw
			if data == "" {
				b, err := json.Marshal(nonNil(e.Data))
				if err != nil {
					return errs.Wrap(errs.InvalidArgument, err, "store: audit data")
				}
				data = string(b)
			}
			if _, err := stmt.ExecContext(ctx, e.Seq, toNanos(e.Time), e.Actor, e.Action, e.SandboxID, e.Owner,
				data, e.PrevHash, e.Hash, e.MAC); err != nil {
				return dbErr(err, "store: append audit seq %d", e.Seq)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_head (id, seq, hash, mac) VALUES (1, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac`,
			head.Seq, head.Hash, head.MAC); err != nil {
			return dbErr(err, "store: audit head")
		}
		return nil
	})
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// AuditHead returns the stored head.
func (s *stateTables) AuditHead(ctx context.Context) (AuditHead, error) {
	var h AuditHead
	err := s.r.QueryRowContext(ctx, `SELECT seq, hash, mac FROM audit_head WHERE id = 1`).Scan(&h.Seq, &h.Hash, &h.MAC)
	if errors.Is(err, sql.ErrNoRows) {
		return AuditHead{}, errs.E(errs.NotFound, "audit chain has no head")
	}
	if err != nil {
		return AuditHead{}, dbErr(err, "store: audit head")
	}
	return h, nil
}

// AuditLast returns the last row of the chain.
func (s *stateTables) AuditLast(ctx context.Context) (AuditEntry, error) {
	got, err := s.listAudit(ctx, `SELECT seq, time, actor, action, sandbox_id, owner, data, prev_hash, hash, mac FROM audit ORDER BY seq DESC LIMIT 1`)
	if err != nil {
		return AuditEntry{}, err
	}
	if len(got) == 0 {
		return AuditEntry{}, errs.E(errs.NotFound, "audit chain is empty")
	}
	return got[0], nil
}

// ListAudit returns matching entries in ascending seq order.
func (s *stateTables) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	var where []string
	var args []any
	if f.AfterSeq > 0 {
		where, args = append(where, "seq > ?"), append(args, f.AfterSeq)
	}
	if !f.Since.IsZero() {
		where, args = append(where, "time >= ?"), append(args, toNanos(f.Since))
	}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if f.Owner != "" {
		where, args = append(where, "owner = ?"), append(args, f.Owner)
	}
	q := `SELECT seq, time, actor, action, sandbox_id, owner, data, prev_hash, hash, mac FROM audit`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY seq"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	return s.listAudit(ctx, q, args...)
}

func (s *stateTables) listAudit(ctx context.Context, q string, args ...any) ([]AuditEntry, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list audit")
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.Actor, &e.Action, &e.SandboxID, &e.Owner, &e.DataRaw, &e.PrevHash, &e.Hash, &e.MAC); err != nil {
			return nil, dbErr(err, "store: list audit")
		}
		e.Time = fromNanos(at)
		// A column that does not decode leaves Data nil; the verifier
		// reports it from DataRaw.
		var d map[string]string
		if json.Unmarshal([]byte(e.DataRaw), &d) == nil {
			e.Data = d
		}
		out = append(out, e)
	}
	return out, dbErr2(rows.Err(), "store: list audit")
}

func dbErr2(err error, msg string) error {
	if err == nil {
		return nil
	}
	return dbErr(err, "%s", msg)
}
