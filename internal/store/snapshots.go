package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// Snapshot is an immutable capture of a sandbox: its filesystem as a new
// read-only layer on top of the template's layers, and optionally a memory
// image. Sandboxes started from it use Layers as their lower layers.
type Snapshot struct {
	ID            string
	Owner         string
	Name          string // optional, unique per owner
	SourceSandbox string
	Template      string // template the source sandbox ran
	TemplateID    string // that template's fingerprint when captured
	Runtime       string // runtime of the source (a memory image only restores there)
	Layers        []string
	MemoryPath    string // host path of the memory image, "" if none
	CreatedAt     time.Time
	Extra         map[string]string
}

var snapshotIDRe = lazyregexp.New(`^[a-z0-9]{1,64}$`)

const snapshotCols = `id, owner, name, source_sandbox, template, template_id, runtime, layers, memory_path, created_at, extra`

// CreateSnapshot inserts a snapshot (CreatedAt defaults to now). A duplicate
// id, or a duplicate non-empty name of the same owner, is AlreadyExists.
func (s *imageTables) CreateSnapshot(ctx context.Context, sn Snapshot) error {
	if !snapshotIDRe.MatchString(sn.ID) {
		return errs.Field("id", "snapshot id must be 1-64 chars of [a-z0-9], got %q", sn.ID)
	}
	if sn.Owner == "" {
		return errs.Field("owner", "must not be empty")
	}
	if len(sn.Layers) == 0 {
		return errs.Field("layers", "a snapshot needs at least one layer")
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = time.Now().UTC()
	}
	layers, err := sliceJSON(sn.Layers)
	if err != nil {
		return err
	}
	extra, err := mapJSON(sn.Extra)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sn.ID, sn.Owner, sn.Name, sn.SourceSandbox, sn.Template, sn.TemplateID, sn.Runtime, layers,
			sn.MemoryPath, toNanos(sn.CreatedAt), extra)
		if err != nil {
			return dbErr(err, "store: create snapshot %s", sn.ID)
		}
		return nil
	})
}

func scanSnapshot(sc scanner) (Snapshot, error) {
	var (
		sn            Snapshot
		layers, extra sql.NullString
		created       int64
	)
	if err := sc.Scan(&sn.ID, &sn.Owner, &sn.Name, &sn.SourceSandbox, &sn.Template, &sn.TemplateID, &sn.Runtime,
		&layers, &sn.MemoryPath, &created, &extra); err != nil {
		return Snapshot{}, err
	}
	sn.CreatedAt = fromNanos(created)
	if err := fromJSON(layers, &sn.Layers); err != nil {
		return Snapshot{}, err
	}
	if err := fromJSON(extra, &sn.Extra); err != nil {
		return Snapshot{}, err
	}
	return sn, nil
}

// GetSnapshot returns one snapshot by id.
func (s *imageTables) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, errs.E(errs.NotFound, "snapshot %s not found", id)
	}
	if err != nil {
		return Snapshot{}, dbErr(err, "store: get snapshot %s", id)
	}
	return sn, nil
}

// ListSnapshots lists owner's snapshots ("" = every owner), oldest first.
func (s *imageTables) ListSnapshots(ctx context.Context, owner string) ([]Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots`
	var args []any
	if owner != "" {
		q += ` WHERE owner = ?`
		args = append(args, owner)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list snapshots")
	}
	defer rows.Close()
	out := []Snapshot{}
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, dbErr(err, "store: list snapshots")
		}
		out = append(out, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list snapshots")
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot's row.
func (s *imageTables) DeleteSnapshot(ctx context.Context, id string) error {
	return s.deleteByKey(ctx, "snapshots", "id", id, "snapshot")
}
