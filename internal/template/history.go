package template

import (
	"context"
	"io"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Import stores a rootfs tarball as a one-layer template, and records the
// import in the template's build history.
func (s *Service) Import(ctx context.Context, name string, r io.Reader, source string) (store.Template, error) {
	start := time.Now()
	t, err := s.importTar(ctx, name, r, source)
	s.recordBuild(ctx, store.BuildImport, name, source, start, t, err)
	return t, err
}

// Pull imports an image as template req.Name: each image layer becomes a
// layer named by its diffID (OCI whiteouts converted), and the image's Env,
// WorkingDir, User and Entrypoint+Cmd become the template's. The pull is
// recorded in the template's build history.
func (s *Service) Pull(ctx context.Context, req PullRequest, progress func(BuildProgress)) (store.Template, error) {
	start := time.Now()
	t, err := s.pull(ctx, req, progress)
	s.recordBuild(ctx, store.BuildPull, req.Name, "image "+req.Image, start, t, err)
	return t, err
}

// Build builds a Dockerfile into template req.Name without a Docker engine
// (see build) and records the build in the template's history.
func (s *Service) Build(ctx context.Context, req BuildRequest, progress func(BuildProgress)) (store.Template, error) {
	start := time.Now()
	t, err := s.build(ctx, req, progress)
	df := req.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	s.recordBuild(ctx, store.BuildDocker, req.Name, "dockerfile "+df, start, t, err)
	return t, err
}

// Builds is template name's build history ("" = every template), newest
// first, at most limit (0 = all kept).
func (s *Service) Builds(ctx context.Context, name string, limit int) ([]store.TemplateBuild, error) {
	if name != "" {
		if err := ValidName(name); err != nil {
			return nil, err
		}
	}
	if limit < 0 {
		return nil, errs.Field("limit", "must not be negative")
	}
	return s.store().ListTemplateBuilds(ctx, name, limit)
}

// recordBuild appends one finished build, failed ones included (a bad
// template name is not recorded: there is no template to file it under). A failure
// to record is logged, never returned: the build itself is what the caller
// asked for.
func (s *Service) recordBuild(ctx context.Context, kind, name, source string, start time.Time, t store.Template, err error) {
	if ValidName(name) != nil {
		return
	}
	b := store.TemplateBuild{Template: name, Kind: kind, Source: source, StartedAt: start, EndedAt: time.Now(),
		Result: store.TemplateReady}
	if t.Source != "" {
		b.Source = t.Source
	}
	if err != nil {
		b.Result, b.Error = store.TemplateFailed, err.Error()
		if len(b.Error) > 1000 {
			b.Error = b.Error[:1000]
		}
	} else {
		b.Fingerprint, b.Layers = t.Fingerprint, len(t.Layers)
	}
	if _, err := s.store().AppendTemplateBuild(context.WithoutCancel(ctx), b); err != nil {
		s.log.Warn("record template build", "template", name, "err", err)
	}
}
