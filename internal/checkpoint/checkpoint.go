// Package checkpoint owns what berth keeps of a sandbox beyond its running
// processes: pauses in every mode (freeze, memory, disk) with their bounded
// memory checkpoint and the honest fallback to disk, resume (restore or cold
// boot), fork (one capture, N children), snapshots (a sandbox's workspace as
// a read-only layer) and layer pinning (a sandbox boots on the layers it was
// made with, for life).
//
// Two services share the package: Service (pause, resume, fork: processes
// and memory images) and Snapshots (filesystem captures, snapshot records,
// pins). Neither owns a sandbox's lifecycle: they reach the lifecycle core
// through Core, which *daemon.Daemon's adapter satisfies, and they take the
// core's per-sandbox lock for every step that changes a sandbox.
//
// State and locks. Service keeps the pause signals of open streams
// (pauseCh) under pauseMu. pauseMu is a leaf: it is taken with or without a
// sandbox's lock held (Core.Lock → pauseMu) and nothing is called while it
// is held. Snapshots has no state of its own beyond the store.
package checkpoint

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/leases"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// Core is what the checkpoint services need of the lifecycle core: its
// primitives (lock, state table, events, runtimes, agent channels), the
// lifecycle steps a pause or fork falls back on (boot, halt, fail, create),
// and the pieces of a boot that a restore repeats (filesystem, network,
// user namespace, admission).
type Core interface {
	// Primitives.
	Lock(id string) func()
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Transition(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	// TransitionLeases is Transition with ch applied to the sandbox's leases
	// in the same commit (store.TransitionLeases).
	TransitionLeases(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error)
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	Runtimes() map[string]runtime.Runtime
	SandboxDir(id string) string
	GoBackground(name string, fn func(ctx context.Context))
	Store() store.Store
	Now() time.Time

	// Lifecycle steps.
	Boot(ctx context.Context, sb *sandbox.Sandbox) error // cold boot from the workspace
	Halt(ctx context.Context, sb *sandbox.Sandbox) error // stop PID 1, keep the workspace
	Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error)
	Spec(sb *sandbox.Sandbox, tpl *store.Template, root string) runtime.Spec
	CreateChild(ctx context.Context, req ChildRequest) (*sandbox.Sandbox, error) // a disk fork's child
	Admit(ctx context.Context, sb *sandbox.Sandbox) error                        // quota, then the creating intent
	CheckAdmit(ctx context.Context, owner string, r sandbox.Resources) error
	ReserveSnapshot(ctx context.Context, owner string) (release func(), err error)
	AccessTokenHash(id, owner string) string

	// Agent channels.
	AgentClient(id string) *agentapi.Client
	Channel(id string) (*agentapi.Channel, error)
	OpenChannel(id string) (*agentapi.Channel, error)
	DropChannel(id string)
	AgentKey(id string) []byte
	EnsureChanDir(id string) error
	WriteEnv(sb *sandbox.Sandbox) error

	// Filesystem, user namespace and network of a boot. The root filesystem
	// of a sandbox in its directory dir is the core's (overlayfs over the
	// lowers on a sized workspace image): made once (PrepareRoot), mounted
	// again on each restore (RemountRoot), unmounted keeping the workspace
	// (TeardownRoot).
	TemplateLowers(tpl *store.Template) ([]string, error)
	PrepareRoot(ctx context.Context, dir string, lowers []string, diskMiB int64, m *rootfs.IDMap) (root string, err error)
	RemountRoot(ctx context.Context, dir string, lowers []string, m *rootfs.IDMap) (root string, err error)
	TeardownRoot(ctx context.Context, dir string) error
	UserNS(sb *sandbox.Sandbox) *rootfs.IDMap
	PickUserNS(ctx context.Context, sb *sandbox.Sandbox) error
	ShareSandboxDir(sb *sandbox.Sandbox) error
	NetUp(ctx context.Context, sb *sandbox.Sandbox, root string) error
	NetDown(ctx context.Context, sb *sandbox.Sandbox) error
	NetTrust(sb *sandbox.Sandbox, root string)
	NetworkInherit(parent *sandbox.Sandbox) sandbox.NetState // what a fork keeps of its parent's network

	// Templates (a snapshot promoted to a template).
	ValidTemplateName(name string) error
	Fingerprint(t store.Template) string
}

// ChildRequest asks the core to create a disk fork's child: a plain
// create from the fork's snapshot.
type ChildRequest struct {
	Owner, Actor, Runtime string
	TTL                   time.Duration
	ExpiryAction          sandbox.ExpiryAction
	Resources             sandbox.Resources
	Labels, Env           map[string]string
	AutoResume            bool
	FromSnapshot          string
	Attrs                 sandbox.Attrs
}

// Config is what the services take from the server configuration.
type Config struct {
	DataDir                 string
	ReadyTimeout            time.Duration // a restored agent's time to answer
	CheckpointTimeout       time.Duration // base bound of one checkpoint or restore
	CheckpointTimeoutPerGiB time.Duration // plus this per started GiB of memory limit
	// Lifetime is the daemon's context: capability probes wait on it.
	Lifetime context.Context
	Log      *slog.Logger
	// Hooks hears pause, resume and fork (internal/statehook). Optional.
	Hooks *statehook.Bus
	// Leases reissues a resumed sandbox's leases in the resume's own commit
	// (internal/leases). Optional: without it the resumed hook does.
	Leases Reissuer
}

// Reissuer plans a resume's lease reissue ahead of its commit (leases.Service).
type Reissuer interface {
	PlanReissue(ctx context.Context, sb *sandbox.Sandbox, actor string) (*leases.Reissue, error)
}

// SnapshotPolicyKey is the key of a snapshot record's Extra that carries
// the network policy (egress JSON) of the sandbox it was taken from.
const SnapshotPolicyKey = "network_policy"

// Service pauses, resumes and forks sandboxes.
type Service struct {
	core  Core
	cfg   Config
	log   *slog.Logger
	snaps *Snapshots

	pauseMu sync.Mutex
	pauseCh map[string]chan struct{}
}

// Snapshots captures, records and pins sandboxes' layers.
type Snapshots struct {
	core   Core
	cfg    Config
	log    *slog.Logger
	layers *template.Store
}

// New makes both services over core; layers is the layer store.
func New(core Core, cfg Config, layers *template.Store) (*Service, *Snapshots) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Lifetime == nil {
		cfg.Lifetime = context.Background()
	}
	sn := &Snapshots{core: core, cfg: cfg, log: cfg.Log, layers: layers}
	return &Service{core: core, cfg: cfg, log: cfg.Log, snaps: sn, pauseCh: map[string]chan struct{}{}}, sn
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

// teardownCtx gives cleanup work its own deadline, detached from the caller.
func teardownCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
}

// recoverHint tells a user how to bring back a failed sandbox whose
// workspace is intact.
func recoverHint(id string) string {
	return "its workspace is kept: `berth start " + id + "` boots it again"
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
