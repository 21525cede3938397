// Package timeline owns a sandbox's timeline: checkpoints (named points a
// sandbox can go back to, each a delta layer holding only what changed
// since the checkpoint before it, plus a memory image where the runtime
// can take one), rewind in place (same id, token, owner, expiry and
// network policy; the sandbox restarts on the checkpoint's layers with an
// empty upper, from its memory image when it has one) and promote (a
// parent takes a fork child's files, and memory where the runtime can,
// keeping its own identity). docs/FORK-MERGE.md §3 and §5 are the design.
//
// State and locks. The timeline's state is in the store (checkpoints and
// each sandbox's timeline head: the view its next checkpoint is a delta
// against); its files are delta layers in the layer store and memory
// images under <data dir>/checkpoints/<id>/. Service has no lock of its
// own: every step that changes a sandbox holds the core's per-sandbox lock
// (Core.Lock), and promote holds the child's and the parent's one after
// the other, never both.
package timeline

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// Core is what the timeline needs of the lifecycle core and of the
// checkpoint services (satisfied by daemon.timelineCore).
type Core interface {
	Lock(id string) func()
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	SandboxDir(id string) string
	Store() store.Store
	Now() time.Time
	UserNS(sb *sandbox.Sandbox) *rootfs.IDMap
	AgentClient(id string) *agentapi.Client
	// ReserveSnapshot holds one unit of owner's snapshot quota (which
	// counts checkpoints) until release.
	ReserveSnapshot(ctx context.Context, owner string) (release func(), err error)

	// Lifecycle steps of a restart: stop PID 1 keeping the workspace,
	// boot from the workspace (a fresh one when disk.img is gone), fail.
	Halt(ctx context.Context, sb *sandbox.Sandbox) error
	// HaltForRestart is Halt keeping the network attachment for a boot
	// that follows at once (Boot keeps an attachment it finds). runc
	// only: a runsc sandbox's attachment has lost its addresses to the
	// runsc netstack (see haltForRestart).
	HaltForRestart(ctx context.Context, sb *sandbox.Sandbox) error
	Boot(ctx context.Context, sb *sandbox.Sandbox) error
	Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error)
	Delete(ctx context.Context, owner, id, actor string) error

	// Of internal/checkpoint: the layers a sandbox boots on, a capture of
	// its upper as a layer, a memory image taken with the sandbox left
	// running, and a restore from one onto a fresh workspace.
	BootLayers(ctx context.Context, sb *sandbox.Sandbox) ([]string, error)
	CaptureUpper(ctx context.Context, sb *sandbox.Sandbox, running bool) (template.Layer, error)
	CheckpointRunning(ctx context.Context, sb *sandbox.Sandbox, img string, capture func(ctx context.Context, running bool) error) (memory bool, reason string, err error)
	RestoreInto(ctx context.Context, sb *sandbox.Sandbox, lowers []string, img, imageOf string, diskMiB int64) error
}

// Config is what the service takes from the server configuration.
type Config struct {
	DataDir string
	Log     *slog.Logger
	// Hooks hears a rewind (Restored) (internal/statehook). Optional.
	Hooks *statehook.Bus
}

// Service keeps checkpoints, rewinds and promotes.
type Service struct {
	core   Core
	cfg    Config
	log    *slog.Logger
	layers *template.Store
}

// New makes the service over core; layers is the layer store.
func New(core Core, cfg Config, layers *template.Store) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{core: core, cfg: cfg, log: cfg.Log, layers: layers}
}

// memoryDir is where checkpoint id's memory image lives.
func (s *Service) memoryDir(id string) string {
	return filepath.Join(s.cfg.DataDir, "checkpoints", id, "memory")
}

// teardownCtx gives restart and cleanup work its own deadline, detached
// from the caller's.
func teardownCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
}
