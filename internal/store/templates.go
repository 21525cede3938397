package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// imageTables owns what sandboxes are made from and captured into:
// templates and their builds (builds.go), snapshots (snapshots.go),
// checkpoints and timeline heads (checkpoints.go), and merges with their
// conflicts (merges.go).
type imageTables struct{ *conn }

const templateCols = `name, fingerprint, layers, start_cmd, env, workdir, user, cpu_millis, memory_mib,
	disk_mib, pids, state, progress, error, source, created_at, updated_at`

func (s *imageTables) PutTemplate(ctx context.Context, t Template) (Template, error) {
	if t.Name == "" {
		return Template{}, errs.Field("name", "must not be empty")
	}
	switch t.State {
	case TemplateBuilding, TemplateReady, TemplateFailed:
	default:
		return Template{}, errs.Field("state", "must be one of %s, %s, %s; got %q",
			TemplateBuilding, TemplateReady, TemplateFailed, t.State)
	}
	now := time.Now().UTC()
	if t.UpdatedAt.IsZero() {
		t.UpdatedAt = now
	}
	layers, err := sliceJSON(t.Layers)
	if err != nil {
		return Template{}, err
	}
	cmd, err := sliceJSON(t.StartCmd)
	if err != nil {
		return Template{}, err
	}
	env, err := mapJSON(t.Env)
	if err != nil {
		return Template{}, err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		var created int64
		err := tx.QueryRowContext(ctx, `SELECT created_at FROM templates WHERE name = ?`, t.Name).Scan(&created)
		switch {
		case err == nil:
			t.CreatedAt = fromNanos(created)
		case errors.Is(err, sql.ErrNoRows):
			if t.CreatedAt.IsZero() {
				t.CreatedAt = now
			}
		default:
			return dbErr(err, "store: put template %s", t.Name)
		}
		_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO templates (`+templateCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			t.Name, t.Fingerprint, layers, cmd, env, t.Workdir, t.User,
			t.Resources.CPUMillis, t.Resources.MemoryMiB, t.Resources.DiskMiB, t.Resources.Pids,
			t.State, t.Progress, t.Error, t.Source, toNanos(t.CreatedAt), toNanos(t.UpdatedAt))
		if err != nil {
			return dbErr(err, "store: put template %s", t.Name)
		}
		return nil
	})
	if err != nil {
		return Template{}, err
	}
	t.CreatedAt, t.UpdatedAt = t.CreatedAt.UTC(), t.UpdatedAt.UTC()
	return t, nil
}

func scanTemplate(sc scanner) (Template, error) {
	var (
		t                Template
		layers, cmd, env sql.NullString
		created, updated int64
	)
	err := sc.Scan(&t.Name, &t.Fingerprint, &layers, &cmd, &env, &t.Workdir, &t.User,
		&t.Resources.CPUMillis, &t.Resources.MemoryMiB, &t.Resources.DiskMiB, &t.Resources.Pids,
		&t.State, &t.Progress, &t.Error, &t.Source, &created, &updated)
	if err != nil {
		return Template{}, err
	}
	t.CreatedAt, t.UpdatedAt = fromNanos(created), fromNanos(updated)
	if err := fromJSON(layers, &t.Layers); err != nil {
		return Template{}, err
	}
	if err := fromJSON(cmd, &t.StartCmd); err != nil {
		return Template{}, err
	}
	if err := fromJSON(env, &t.Env); err != nil {
		return Template{}, err
	}
	return t, nil
}

func (s *imageTables) GetTemplate(ctx context.Context, name string) (Template, error) {
	t, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, errs.E(errs.NotFound, "template %s not found", name)
	}
	if err != nil {
		return Template{}, dbErr(err, "store: get template %s", name)
	}
	return t, nil
}

func (s *imageTables) ListTemplates(ctx context.Context) ([]Template, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+templateCols+` FROM templates ORDER BY name`)
	if err != nil {
		return nil, dbErr(err, "store: list templates")
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, dbErr(err, "store: list templates")
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list templates")
	}
	return out, nil
}

func (s *imageTables) DeleteTemplate(ctx context.Context, name string) error {
	return s.deleteByKey(ctx, "templates", "name", name, "template")
}
