package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// BuildEvent is one line of a pull or build stream (application/x-ndjson):
// "progress" lines, then exactly one "result" or "error" line.
type BuildEvent = wire.BuildEvent

// progressStream starts the NDJSON response at the first progress line, so
// an error before any (bad input) is still an ordinary error response.
type progressStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	started bool
}

func (s *progressStream) send(ev BuildEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	b, _ := json.Marshal(ev)
	_, _ = s.w.Write(append(b, '\n'))
	_ = http.NewResponseController(s.w).Flush()
}

func (s *progressStream) progress(p template.BuildProgress) {
	s.send(BuildEvent{Type: "progress", BuildProgress: wire.BuildProgress(p)})
}

// finish writes the result or the error, in the stream once it has started.
func (s *progressStream) finish(t store.Template, err error) error {
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if err != nil && !started {
		return err
	}
	if err != nil {
		b := httpx.ErrorBody(err)
		s.send(BuildEvent{Type: "error", Error: &b})
		return nil
	}
	v := templateView(t)
	s.send(BuildEvent{Type: "result", Template: &v})
	return nil
}

// PullRequest is the body of POST /v1/templates/{name}/pull.
type PullRequest = wire.PullRequest

func (s imageAPI) pullTemplate(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may pull templates")
	}
	var req PullRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ps := &progressStream{w: w}
	t, err := s.d.Templates().Pull(r.Context(), template.PullRequest{Name: r.PathValue("name"), Image: req.Image,
		Username: req.Username, Password: req.Password, Insecure: req.Insecure}, ps.progress)
	return ps.finish(t, err)
}

// buildTemplate takes the build context as a tar body; the Dockerfile's
// path, build args, network and no_cache are query parameters.
func (s imageAPI) buildTemplate(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may build templates")
	}
	q := r.URL.Query()
	args := map[string]string{}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return errs.Field("build_arg", "%q is not NAME=VALUE", kv)
		}
		args[k] = v
	}
	switch q.Get("network") {
	case "", "allow-all", "deny-all":
	default:
		return errs.Field("network", "must be allow-all or deny-all, got %q", q.Get("network"))
	}
	scratch := filepath.Join(s.d.Config().DataDir, "templates")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "build scratch dir")
	}
	dir, err := os.MkdirTemp(scratch, "context-")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "build scratch dir")
	}
	defer os.RemoveAll(dir)
	if err := template.ExtractBuildContext(r.Context(), r.Body, dir); err != nil {
		return errs.Wrap(errs.KindOf(err), err, "build context")
	}
	ps := &progressStream{w: w}
	t, err := s.d.Templates().Build(r.Context(), template.BuildRequest{Name: r.PathValue("name"), ContextDir: dir,
		Dockerfile: q.Get("dockerfile"), BuildArgs: args, Network: q.Get("network"), NoCache: q.Get("no_cache") == "true"}, ps.progress)
	return ps.finish(t, err)
}

func (s imageAPI) deleteTemplate(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may remove templates")
	}
	n, err := s.d.Templates().Remove(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TemplateDeleted{Removed: r.PathValue("name"), LayersCollected: n})
	return nil
}
