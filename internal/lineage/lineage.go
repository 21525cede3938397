// Package lineage owns which layers make a sandbox's tree and how trees of
// one lineage differ: it builds fsdiff views of a sandbox (its live upper
// over its lowers), of its fork point and of any layer stack (a snapshot,
// a checkpoint), and answers diff and compare over them
// (docs/FORK-MERGE.md §1–3). It keeps no state of its own beyond which
// runsc sandboxes keep their writes on the host (a cache of the runtime's
// answer) and holds no lock of the core: views read a live upper "as of
// about now".
package lineage

import (
	"context"
	"log/slog"
	"sync"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the lineage service needs of the lifecycle core
// (satisfied by daemon.lineageCore).
type Core interface {
	// Visible loads a sandbox, hiding other owners' behind NotFound
	// (owner "" is the admin view).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	// UpperDir is the host directory of sb's upper layer while its
	// workspace is mounted (FailedPrecondition when it is not: stopped,
	// paused to memory or disk).
	UpperDir(sb *sandbox.Sandbox) (string, error)
	// Lock takes sb's lifecycle lock (nothing starts, stops or deletes
	// it until the returned unlock).
	Lock(id string) func()
	// MountWorkspace mounts the workspace of a sandbox that is not
	// running read-only and returns its upper dir and the undo step; the
	// caller holds the sandbox's lock until it has undone it.
	MountWorkspace(ctx context.Context, sb *sandbox.Sandbox) (upper string, release func() error, err error)
	// UserNS is the id mapping sb's upper was written through (nil: none).
	UserNS(sb *sandbox.Sandbox) *rootfs.IDMap
	// LayerPath is the host directory of the read-only layer digest.
	LayerPath(digest string) string
	Store() store.Store
	Executor
}

// CheckpointResolver turns a checkpoint of a sandbox into its layer stack,
// top first (the timeline service satisfies it). Until one is set, a
// checkpoint is NotFound.
type CheckpointResolver interface {
	CheckpointLayers(ctx context.Context, sandboxID, checkpointID string) ([]string, error)
}

// Config configures the service.
type Config struct {
	DataDir string // scratch for exported upper tars: <DataDir>/lineage
	Log     *slog.Logger
}

// Service builds views and diffs of sandboxes.
type Service struct {
	core Core
	cfg  Config
	log  *slog.Logger

	mu          sync.Mutex      // leaf: guards the fields below
	hostUpper   map[string]bool // runsc sandboxes whose writes are in the host upper (--overlay2=none)
	checkpoints CheckpointResolver
	seq         uint64
}

// New builds the service.
func New(core Core, cfg Config) *Service {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	return &Service{core: core, cfg: cfg, log: log, hostUpper: map[string]bool{}}
}

// SetCheckpoints installs the resolver of `against=checkpoint:ID`.
func (s *Service) SetCheckpoints(r CheckpointResolver) {
	s.mu.Lock()
	s.checkpoints = r
	s.mu.Unlock()
}

func (s *Service) checkpointResolver() CheckpointResolver {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpoints
}
