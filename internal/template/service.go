package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Service is the template domain of one server: it imports rootfs tarballs,
// pulls images from registries and OCI layouts, builds Dockerfiles (RUN
// steps in short-lived sandboxes of the core), removes templates and
// garbage-collects layers. It owns the template records' lifecycle in the
// store, the build cache settings and the coordination between concurrent
// work on one data dir (tplWork): one download per image and layer, and
// layer GC that waits for imports and builds in progress.
//
// Lock: tplWork.gc (an RWMutex; read = an import/pull/build in progress,
// write = GC). While a build holds it for reading, the core takes its own
// per-sandbox lock (Core.Lock) for the build sandboxes; the core never
// calls back into the Service while holding a sandbox lock, so the order is
// tplWork.gc, then a sandbox lock.
type Service struct {
	cfg     ServiceConfig
	core    Core
	layers  *Store
	log     *slog.Logger
	tplWork templateWork
}

// ServiceConfig is what the Service takes from the server's configuration.
type ServiceConfig struct {
	DefaultTemplate string // name of the template EnsureDefault builds
}

// Core is what the Service needs from the lifecycle core (satisfied by
// *daemon.Daemon).
type Core interface {
	Store() store.Store
	Log() *slog.Logger
	Lock(id string) func()
	GoBackground(name string, fn func(ctx context.Context))
	AgentClient(id string) *agentapi.Client
	// OpenStream marks a client stream on sandbox id (the reaper leaves
	// the sandbox alone while one is open); done closes it.
	OpenStream(id string) (done func())

	// StartBuildSandbox boots a sandbox owned by BuildOwner on the given
	// layers (top first) for one RUN step, with network mode network
	// ("" = allow-all when the server has networking); note reports what
	// it does. It returns once the sandbox's agent answers.
	StartBuildSandbox(ctx context.Context, layers []string, network string, note func(msg string)) (*sandbox.Sandbox, error)
	// RemoveBuildSandbox deletes a build sandbox.
	RemoveBuildSandbox(ctx context.Context, id string) error
	// CaptureWorkspace stores a running sandbox's workspace as a new
	// layer; the caller holds the sandbox's lock.
	CaptureWorkspace(ctx context.Context, sb *sandbox.Sandbox) (Layer, error)
	// TemplateUsers lists the sandboxes (not deleted, not warm pool
	// members) made from template name.
	TemplateUsers(ctx context.Context, name string) ([]string, error)
	// HasPool reports whether template name has a warm pool.
	HasPool(ctx context.Context, name string) (bool, error)
	// PinnedLayers reports the layers sandbox records pin (each sandbox
	// boots on its layers for life).
	PinnedLayers(ctx context.Context) (map[string]bool, error)
}

// templateWork is per data dir: concurrent pulls of one image download it
// once, and layer garbage collection waits for imports in progress.
type templateWork struct {
	flight singleflight.Group
	gc     sync.RWMutex // read: an import/build in progress; write: gc
}

// NewService wires the template service over the layer store.
func NewService(cfg ServiceConfig, layers *Store, core Core) *Service {
	return &Service{cfg: cfg, core: core, layers: layers, log: core.Log()}
}

func (s *Service) store() store.Store { return s.core.Store() }

func (s *Service) work() *templateWork { return &s.tplWork }

var templateNameRe = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName checks a template name.
func ValidName(name string) error {
	if !templateNameRe.MatchString(name) {
		return errs.Field("name", "template names are 1-63 chars of lowercase letters, digits, '.', '_', '-', got %q", name)
	}
	return nil
}

// FingerprintOf is a template record's fingerprint: the hash of its
// ordered layers and defaults.
func FingerprintOf(t store.Template) string {
	h := sha256.New()
	io.WriteString(h, strings.Join(t.Layers, ","))
	io.WriteString(h, "\x00"+strings.Join(t.StartCmd, "\x00")+"\x00"+t.Workdir+"\x00"+t.User)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// importTar stores a rootfs tarball as a one-layer template (Import records it).
func (s *Service) importTar(ctx context.Context, name string, r io.Reader, source string) (store.Template, error) {
	if err := ValidName(name); err != nil {
		return store.Template{}, err
	}
	prev, _ := s.store().GetTemplate(ctx, name)
	_, _ = s.store().PutTemplate(ctx, store.Template{Name: name, State: store.TemplateBuilding, Progress: "importing", Source: source,
		Layers: prev.Layers, Fingerprint: prev.Fingerprint, CreatedAt: prev.CreatedAt})
	layer, err := s.layers.ImportTar(ctx, r, func(p Progress) {})
	if err != nil {
		t := store.Template{Name: name, State: store.TemplateFailed, Error: err.Error(), Source: source}
		_, _ = s.store().PutTemplate(context.WithoutCancel(ctx), t)
		return store.Template{}, err
	}
	t := store.Template{Name: name, Layers: []string{layer.Digest}, State: store.TemplateReady, Source: source}
	t.Fingerprint = FingerprintOf(t)
	return s.store().PutTemplate(ctx, t)
}

// EnsureDefault builds the default template in the background when it is
// missing, with progress visible in `berth template ls`.
func (s *Service) EnsureDefault(cacheDir string) {
	ctx := context.Background()
	if t, err := s.store().GetTemplate(ctx, s.cfg.DefaultTemplate); err == nil && t.State == store.TemplateReady {
		if _, err := s.layers.Lowers(t.Name, t.Layers); err == nil {
			return
		}
	}
	s.core.GoBackground("default-template", func(ctx context.Context) {
		name := s.cfg.DefaultTemplate
		put := func(state, progress, errText string) {
			if _, err := s.store().PutTemplate(context.WithoutCancel(ctx), store.Template{Name: name, State: state, Progress: progress,
				Error: errText, Source: "debootstrap bookworm"}); err != nil {
				s.log.Error("template state", "template", name, "err", err)
			}
		}
		put(store.TemplateBuilding, "starting", "")
		s.log.Info("preparing the default template (debootstrap on the first run, then from the cache)", "template", name)
		tarPath, err := BuildDefault(ctx, cacheDir, func(p Progress) {
			put(store.TemplateBuilding, p.Phase+": "+p.Message, "")
		})
		if err != nil {
			s.log.Error("default template build failed", "template", name, "err", err)
			put(store.TemplateFailed, "", err.Error())
			return
		}
		put(store.TemplateBuilding, "import: "+tarPath, "")
		layer, err := s.layers.ImportFile(ctx, tarPath, func(p Progress) {})
		if err != nil {
			put(store.TemplateFailed, "", err.Error())
			return
		}
		t := store.Template{Name: name, Layers: []string{layer.Digest}, State: store.TemplateReady, Source: "debootstrap bookworm"}
		t.Fingerprint = FingerprintOf(t)
		if _, err := s.store().PutTemplate(context.WithoutCancel(ctx), t); err != nil {
			s.log.Error("template state", "template", name, "err", err)
			return
		}
		s.log.Info("default template ready", "template", name, "layer", layer.Digest)
	})
}

// Lowers resolves a template's layer digests to host paths, top first;
// tpl names the template in errors.
func (s *Store) Lowers(tpl string, digests []string) ([]string, error) {
	lowers := make([]string, 0, len(digests))
	for _, dg := range digests {
		p := s.LayerPath(dg)
		if _, err := os.Stat(p); err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %s of template %s is missing", dg, tpl)
		}
		lowers = append(lowers, p)
	}
	if len(lowers) == 0 {
		return nil, errs.E(errs.FailedPrecondition, "template %s has no layers", tpl)
	}
	return lowers, nil
}
