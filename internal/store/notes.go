package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Note is one handoff note of a sandbox (internal/notes). The store keeps
// the columns it orders and selects by typed; Body is the note as the
// notes service encoded it (its own typed JSON) and Manifest the file
// manifest the next note is compared with (nil once pruned).
type Note struct {
	Sandbox   string
	Seq       int64 // 1, 2, ... per sandbox, assigned by AppendNote
	Owner     string
	Trigger   string // pause, stop, demand, fork, restore
	CreatedAt time.Time
	// At is the moment of the machine state the note describes (a restored
	// note describes an older point; usually CreatedAt).
	At       time.Time
	Body     []byte
	Manifest []byte
}

// NoteStore holds handoff notes. Deleting a sandbox deletes its notes.
type NoteStore interface {
	// AppendNote stores n with the next Seq of its sandbox, then keeps the
	// sandbox's newest keep notes and the manifests of its newest
	// keepManifests, all in one transaction; it returns n as stored.
	AppendNote(ctx context.Context, n Note, keep, keepManifests int) (Note, error)
	// ListNotes lists a sandbox's notes newest first, at most limit (0 = all).
	ListNotes(ctx context.Context, sandboxID string, limit int) ([]Note, error)
	// GetNote is one note by seq (NotFound if none).
	GetNote(ctx context.Context, sandboxID string, seq int64) (Note, error)
	// NoteAt is the newest note whose At is at or before at (NotFound if none).
	NoteAt(ctx context.Context, sandboxID string, at time.Time) (Note, error)
}

const notesSchema = `
CREATE TABLE notes (
	sandbox_id TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	owner      TEXT NOT NULL,
	trigger    TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	at         INTEGER NOT NULL,
	body       BLOB NOT NULL,
	manifest   BLOB,
	PRIMARY KEY (sandbox_id, seq)
) STRICT;
CREATE INDEX notes_sandbox_at ON notes (sandbox_id, at);
CREATE TRIGGER notes_sandbox_deleted AFTER DELETE ON sandboxes
BEGIN
	DELETE FROM notes WHERE sandbox_id = OLD.id;
END;
`

const noteCols = `sandbox_id, seq, owner, trigger, created_at, at, body, manifest`

// AppendNote inserts n with the next seq and prunes old notes and manifests.
func (s *stateTables) AppendNote(ctx context.Context, n Note, keep, keepManifests int) (Note, error) {
	switch {
	case n.Sandbox == "":
		return Note{}, errs.Field("sandbox", "must not be empty")
	case n.Owner == "":
		return Note{}, errs.Field("owner", "must not be empty")
	case n.Trigger == "":
		return Note{}, errs.Field("trigger", "must not be empty")
	case keep < 1:
		return Note{}, errs.Field("keep", "must be at least 1, got %d", keep)
	}
	if n.CreatedAt.IsZero() {
		n.CreatedAt = time.Now().UTC()
	}
	if n.At.IsZero() {
		n.At = n.CreatedAt
	}
	if n.Body == nil {
		n.Body = []byte{}
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM notes WHERE sandbox_id = ?`, n.Sandbox).Scan(&n.Seq); err != nil {
			return dbErr(err, "store: next note seq of %s", n.Sandbox)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO notes (`+noteCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			n.Sandbox, n.Seq, n.Owner, n.Trigger, toNanos(n.CreatedAt), toNanos(n.At), n.Body, n.Manifest); err != nil {
			return dbErr(err, "store: append note of %s", n.Sandbox)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM notes WHERE sandbox_id = ? AND seq <= ?`, n.Sandbox, n.Seq-int64(keep)); err != nil {
			return dbErr(err, "store: prune notes of %s", n.Sandbox)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE notes SET manifest = NULL WHERE sandbox_id = ? AND seq <= ? AND manifest IS NOT NULL`,
			n.Sandbox, n.Seq-int64(max(keepManifests, 0))); err != nil {
			return dbErr(err, "store: prune note manifests of %s", n.Sandbox)
		}
		return nil
	})
	if err != nil {
		return Note{}, err
	}
	return n, nil
}

func scanNote(sc scanner) (Note, error) {
	var (
		n           Note
		created, at int64
	)
	if err := sc.Scan(&n.Sandbox, &n.Seq, &n.Owner, &n.Trigger, &created, &at, &n.Body, &n.Manifest); err != nil {
		return Note{}, err
	}
	n.CreatedAt, n.At = fromNanos(created), fromNanos(at)
	return n, nil
}

// ListNotes lists a sandbox's notes newest first.
func (s *stateTables) ListNotes(ctx context.Context, sandboxID string, limit int) ([]Note, error) {
	q := `SELECT ` + noteCols + ` FROM notes WHERE sandbox_id = ? ORDER BY seq DESC`
	args := []any{sandboxID}
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(err, "store: list notes of %s", sandboxID)
	}
	defer rows.Close()
	var out []Note
	for rows.Next() {
		n, err := scanNote(rows)
		if err != nil {
			return nil, dbErr(err, "store: scan note")
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list notes of %s", sandboxID)
	}
	return out, nil
}

// GetNote returns one note.
func (s *stateTables) GetNote(ctx context.Context, sandboxID string, seq int64) (Note, error) {
	n, err := scanNote(s.r.QueryRowContext(ctx, `SELECT `+noteCols+` FROM notes WHERE sandbox_id = ? AND seq = ?`, sandboxID, seq))
	if errors.Is(err, sql.ErrNoRows) {
		return Note{}, errs.E(errs.NotFound, "note %d of sandbox %s not found", seq, sandboxID)
	}
	if err != nil {
		return Note{}, dbErr(err, "store: get note %d of %s", seq, sandboxID)
	}
	return n, nil
}

// NoteAt returns the newest note describing a moment at or before at.
func (s *stateTables) NoteAt(ctx context.Context, sandboxID string, at time.Time) (Note, error) {
	n, err := scanNote(s.r.QueryRowContext(ctx, `SELECT `+noteCols+` FROM notes WHERE sandbox_id = ? AND at <= ?
		ORDER BY at DESC, seq DESC LIMIT 1`, sandboxID, toNanos(at)))
	if errors.Is(err, sql.ErrNoRows) {
		return Note{}, errs.E(errs.NotFound, "sandbox %s has no note at or before %s", sandboxID, at.UTC().Format(time.RFC3339))
	}
	if err != nil {
		return Note{}, dbErr(err, "store: note of %s at %s", sandboxID, at)
	}
	return n, nil
}
