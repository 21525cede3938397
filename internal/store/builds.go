package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// MaxTemplateBuilds is how many builds a template's history keeps.
const MaxTemplateBuilds = 200

// Template build kinds and results.
const (
	BuildImport = "import"
	BuildPull   = "pull"
	BuildDocker = "build"
)

// TemplateBuild is one finished import, pull or Dockerfile build of a
// template: when it ran, what came out (Result is TemplateReady or
// TemplateFailed) and the fingerprint it produced.
type TemplateBuild struct {
	Seq         int64
	Template    string
	Kind        string // BuildImport, BuildPull or BuildDocker
	Source      string
	StartedAt   time.Time
	EndedAt     time.Time
	Result      string
	Fingerprint string
	Layers      int
	Error       string
}

// Duration is how long the build took.
func (b TemplateBuild) Duration() time.Duration { return b.EndedAt.Sub(b.StartedAt) }

func (s *imageTables) AppendTemplateBuild(ctx context.Context, b TemplateBuild) (int64, error) {
	if b.Template == "" {
		return 0, errs.Field("template", "must not be empty")
	}
	switch b.Kind {
	case BuildImport, BuildPull, BuildDocker:
	default:
		return 0, errs.Field("kind", "must be one of %s, %s, %s; got %q", BuildImport, BuildPull, BuildDocker, b.Kind)
	}
	switch b.Result {
	case TemplateReady, TemplateFailed:
	default:
		return 0, errs.Field("result", "must be %s or %s; got %q", TemplateReady, TemplateFailed, b.Result)
	}
	if b.StartedAt.IsZero() || b.EndedAt.Before(b.StartedAt) {
		return 0, errs.Field("ended_at", "must not be before started_at (both set)")
	}
	var seq int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO template_builds (template, kind, source, started_at, ended_at, result,
			fingerprint, layers, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			b.Template, b.Kind, b.Source, toNanos(b.StartedAt), toNanos(b.EndedAt), b.Result, b.Fingerprint, b.Layers, b.Error)
		if err != nil {
			return dbErr(err, "store: append build of %s", b.Template)
		}
		if seq, err = res.LastInsertId(); err != nil {
			return dbErr(err, "store: append build of %s", b.Template)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM template_builds WHERE template = ? AND seq <= ?`, b.Template, seq-MaxTemplateBuilds)
		return dbErr(err, "store: trim builds of %s", b.Template)
	})
	return seq, err
}

func (s *imageTables) ListTemplateBuilds(ctx context.Context, template string, limit int) ([]TemplateBuild, error) {
	if limit <= 0 || limit > MaxTemplateBuilds {
		limit = MaxTemplateBuilds
	}
	rows, err := s.r.QueryContext(ctx, `SELECT seq, template, kind, source, started_at, ended_at, result, fingerprint, layers, error
		FROM template_builds WHERE (? = '' OR template = ?) ORDER BY seq DESC LIMIT ?`, template, template, limit)
	if err != nil {
		return nil, dbErr(err, "store: list builds")
	}
	defer rows.Close()
	out := []TemplateBuild{}
	for rows.Next() {
		var b TemplateBuild
		var started, ended int64
		if err := rows.Scan(&b.Seq, &b.Template, &b.Kind, &b.Source, &started, &ended, &b.Result, &b.Fingerprint,
			&b.Layers, &b.Error); err != nil {
			return nil, dbErr(err, "store: scan build")
		}
		b.StartedAt, b.EndedAt = fromNanos(started), fromNanos(ended)
		out = append(out, b)
	}
	return out, dbErr(rows.Err(), "store: list builds")
}
