package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berth-dev/berth/internal/errs"
)

// SQLite is the embedded Store: one database file in WAL mode, written
// through a single connection (so writers queue in Go, never on SQLITE_BUSY)
// and read through a small pool of query-only connections that WAL lets run
// alongside the writer.
//
// SQLite itself only opens, migrates and closes the database; the Store's
// methods live on one table group per domain, each declared beside its
// tables and sharing the two handles:
//
//	lifecycleTables  sandboxes, events, settings, api keys    (sandboxes.go)
//	imageTables      templates, builds, snapshots, checkpoints,
//	                 timeline heads, merges                   (templates.go)
//	meteringTables   usage, quotas, usage hours, egress log,
//	                 secrets, activity                        (usage.go)
//	stateTables      tasks, notes, audit, leases, effects     (tasks.go)
//
// A write that spans groups (DeleteSandbox removing a sandbox's leases and
// timeline) calls a plain function of the other group's file that takes
// the transaction (deleteLeases, deleteTimeline).
type SQLite struct {
	*conn
	lifecycleTables
	imageTables
	meteringTables
	stateTables
}

// conn is the pair of handles every table group shares.
type conn struct {
	w *sql.DB // exactly one connection; every write transaction
	r *sql.DB // query-only connections for plain reads
}

var _ Store = (*SQLite)(nil)

const readConns = 4

// OpenSQLite opens (creating if needed) the database file at path and
// migrates its schema to the version this binary knows.
func OpenSQLite(path string) (*SQLite, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, errs.Field("path", "must be a non-empty file path without '?', got %q", path)
	}
	// synchronous=FULL: a commit is on disk before it returns, so neither a
	// SIGKILL nor a power cut loses a committed write. _txlock=immediate takes
	// the write lock at BEGIN, so a read-modify-write never upgrades a lock
	// (and cannot deadlock against another process).
	// The database holds API key hashes, access tokens and sealed secrets:
	// 0600, and SQLite gives the -wal and -shm files the database's mode.
	if err := privateFiles(path); err != nil {
		return nil, err
	}
	common := url.Values{}
	common.Add("_pragma", "busy_timeout(10000)")
	common.Add("_pragma", "foreign_keys(1)")
	common.Add("_pragma", "synchronous(FULL)")

	wq := cloneValues(common)
	wq.Add("_pragma", "journal_mode(WAL)")
	wq.Set("_txlock", "immediate")
	w, err := sql.Open("sqlite", path+"?"+wq.Encode())
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "store: open %s", path)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := migrate(context.Background(), w, migrations); err != nil {
		w.Close()
		return nil, err
	}

	rq := cloneValues(common)
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, errs.Wrap(errs.Internal, err, "store: open %s", path)
	}
	r.SetMaxOpenConns(readConns)
	r.SetMaxIdleConns(readConns)
	if err := r.Ping(); err != nil {
		w.Close()
		r.Close()
		return nil, dbErr(err, "store: open %s", path)
	}
	if err := privateFiles(path); err != nil {
		w.Close()
		r.Close()
		return nil, err
	}
	return newSQLite(&conn{w: w, r: r}), nil
}

func newSQLite(c *conn) *SQLite {
	return &SQLite{
		conn:            c,
		lifecycleTables: lifecycleTables{c},
		imageTables:     imageTables{c},
		meteringTables:  meteringTables{c},
		stateTables:     stateTables{c},
	}
}

// privateFiles creates the database file 0600 if it is missing and makes it
// and its -wal and -shm files 0600 (databases made by older versions were
// 0644).
func privateFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "store: create %s", path)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return errs.Wrap(errs.Internal, err, "store: chmod %s", p)
		}
	}
	return nil
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// Close closes both connection pools.
func (s *SQLite) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// migrate applies the migrations the database has not seen yet, each in
// its own transaction together with its user_version bump.
func migrate(ctx context.Context, db *sql.DB, migs []string) error {
	for {
		done, err := migrateOne(ctx, db, migs)
		if err != nil || done {
			return err
		}
	}
}

func migrateOne(ctx context.Context, db *sql.DB, migs []string) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, dbErr(err, "store: migrate: begin")
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return false, dbErr(err, "store: read schema version")
	}
	switch {
	case v > len(migs):
		return false, errs.E(errs.FailedPrecondition,
			"store: database schema version %d is newer than this binary's %d; upgrade berth", v, len(migs))
	case v == len(migs):
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, migs[v]); err != nil {
		return false, dbErr(err, "store: migration %d", v+1)
	}
	if hook := migrationHooks[v+1]; hook != nil {
		if err := hook(ctx, tx); err != nil {
			return false, dbErr(err, "store: migration %d", v+1)
		}
	}
	// PRAGMA takes no bind parameters; v+1 is an int we computed.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
		return false, dbErr(err, "store: migration %d: set version", v+1)
	}
	if err := tx.Commit(); err != nil {
		return false, dbErr(err, "store: migration %d: commit", v+1)
	}
	return false, nil
}

// write runs fn in a write transaction and commits if fn returns nil.
// Errors from fn are returned as they are.
func (s *conn) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return dbErr(err, "store: begin")
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return dbErr(err, "store: commit")
	}
	return nil
}

// deleteByKey deletes the row of table whose column equals key, or returns
// NotFound naming what.
func (s *conn) deleteByKey(ctx context.Context, table, column, key, what string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		// table and column are constants of this package, never input.
		res, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+column+` = ?`, key)
		if err != nil {
			return dbErr(err, "store: delete %s %s", what, key)
		}
		if n, err := res.RowsAffected(); err != nil {
			return dbErr(err, "store: delete %s %s", what, key)
		} else if n == 0 {
			return errs.E(errs.NotFound, "%s %s not found", what, key)
		}
		return nil
	})
}

// dbErr classifies a database error: context errors stay unclassified (so
// errors.Is(err, context.Canceled) holds), lock timeouts are Unavailable,
// constraint violations AlreadyExists, everything else Internal.
func dbErr(err error, format string, args ...any) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf(format+": %w", append(args, err)...)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return errs.Wrap(errs.Unavailable, err, format, args...)
		case sqlite3.SQLITE_CONSTRAINT:
			if c := se.Code(); c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || c == sqlite3.SQLITE_CONSTRAINT_UNIQUE {
				return errs.Wrap(errs.AlreadyExists, err, format, args...)
			}
		}
	}
	return errs.Wrap(errs.Internal, err, format, args...)
}

// Times are stored as UTC unix nanoseconds; 0 stands for the zero time.
func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// toJSON encodes a map or slice for a JSON column; nil stays NULL so that
// nil and empty round-trip distinctly.
func toJSON[T any](v T, isNil bool) (any, error) {
	if isNil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "store: encode json")
	}
	return string(b), nil
}

func mapJSON(m map[string]string) (any, error) { return toJSON(m, m == nil) }
func sliceJSON(s []string) (any, error)        { return toJSON(s, s == nil) }

func fromJSON(col sql.NullString, dst any) error {
	if !col.Valid {
		return nil
	}
	if err := json.Unmarshal([]byte(col.String), dst); err != nil {
		return errs.Wrap(errs.Internal, err, "store: decode json column")
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }
