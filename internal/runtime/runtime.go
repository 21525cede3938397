// Package runtime runs sandboxes through an OCI runtime's CLI (runc or
// gVisor's runsc) with a generated config.json. The daemon consumes the
// Runtime interface; internal/runtime/oci implements it for both backends,
// internal/runtime/fake in-process for unit tests without root, and
// internal/runtime/runtimetest is the conformance suite every backend runs
// (the fake its contract part, which needs no kernel).
package runtime

import (
	"context"
	"syscall"
	"time"
)

// Mount is an extra bind mount into the sandbox.
type Mount struct {
	Source   string // host path
	Target   string // path inside the sandbox
	ReadOnly bool
}

// IDMap maps container uids and gids 0..Size-1 to host ids HostID.. (the
// same range for both).
type IDMap struct {
	HostID uint32
	Size   uint32
}

// Resources are cgroup limits; zero means unlimited.
type Resources struct {
	CPUMillis   int   // CFS quota: 1000 = one core
	MemoryBytes int64 // memory limit (swap disabled)
	Pids        int64
}

// Spec is everything needed to start one sandbox. Pure data: the backend
// turns it into config.json in BundleDir.
type Spec struct {
	ID        string
	BundleDir string // host dir owned by the sandbox; config.json goes here
	RootFS    string // host path of the prepared (overlay) root filesystem
	Hostname  string
	Args      []string // PID 1 command, e.g. ["/.berth/berth-agent"]
	Env       []string
	Cwd       string
	Mounts    []Mount
	Resources Resources
	// NetNSPath joins an existing network namespace; "" creates a fresh one
	// with loopback only.
	NetNSPath string
	// UserNS runs the sandbox in a user namespace: ids 0..Size-1 inside
	// are host ids HostID..HostID+Size-1, so root inside is an unprivileged
	// host uid. nil: no user namespace (runsc, whose Sentry is the boundary,
	// or a workspace made before user namespaces). Its root filesystem must
	// already show the mapped ids (idmapped lowers, shifted upper).
	UserNS *IDMap
	// LogPath receives the runtime's own log (and PID 1's stdout/stderr when
	// StdioPath is empty).
	LogPath string
}

// Status is what the backend reports about one container.
type Status struct {
	ID      string
	State   string // "created", "running", "paused", "stopped"
	Pid     int
	Created time.Time
}

// Capabilities says what a backend can do on this host.
type Capabilities struct {
	Checkpoint       bool   // memory checkpoint/restore works
	CheckpointReason string // why not, if not
	Freeze           bool
}

// Stats is cgroup accounting for one sandbox.
type Stats struct {
	CPUUsageNanos uint64
	MemoryBytes   uint64 // current usage
	MemoryPeak    uint64
	Pids          uint64
	OOMKills      uint64
}

// NetworkReader is a Runtime that says whether it reads the configuration
// of the sandbox's network namespace when it starts. gVisor does (its
// netstack copies the namespace's links, addresses and routes at boot);
// runc only joins the namespace by its path, so the network can be
// finished while it starts. A Runtime that is not a NetworkReader is taken
// to read it.
type NetworkReader interface {
	ReadsNetworkAtStart() bool
}

// ReadsNetworkAtStart says whether rt needs the sandbox's network complete
// before Run.
func ReadsNetworkAtStart(rt Runtime) bool {
	nr, ok := rt.(NetworkReader)
	return !ok || nr.ReadsNetworkAtStart()
}

// Runtime is one OCI backend.
type Runtime interface {
	Name() string
	// Run creates and starts the container detached. On error nothing is left behind.
	Run(ctx context.Context, spec Spec) error
	// State reports one container; an errs.NotFound error if it does not exist.
	State(ctx context.Context, id string) (Status, error)
	// List reports every container this backend knows (for reconciliation).
	List(ctx context.Context) ([]Status, error)
	Kill(ctx context.Context, id string, sig syscall.Signal) error
	// Delete force-removes the container; deleting a missing one is not an error.
	Delete(ctx context.Context, id string) error
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
	// Checkpoint writes a memory image to imageDir (durable on return) and
	// stops the container's processes (RAM freed); Delete removes what is
	// left of the container (runsc keeps listing it until then).
	Checkpoint(ctx context.Context, id, imageDir string) error
	// Restore starts a container from a memory image; spec must match the one checkpointed
	// (apart from ID, BundleDir and RootFS, which may differ: that is a fork).
	Restore(ctx context.Context, spec Spec, imageDir string) error
	Capabilities(ctx context.Context) Capabilities
	Stats(ctx context.Context, id string) (Stats, error)
}
