package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Config is the daemon's part of the server configuration.
type Config struct {
	DataDir          string
	DefaultRuntime   string
	DefaultTemplate  string
	DefaultTTL       time.Duration
	MaxTTL           time.Duration
	DefaultResources sandbox.Resources
	MaxResources     sandbox.Resources
	AgentPath        string        // host path of the static berth-agent binary
	ReadyTimeout     time.Duration // how long a new sandbox's agent may take to answer
	Log              *slog.Logger
	Now              func() time.Time
	// Reaper, quotas and prices (reaper.go, quota.go, usage.go).
	Reaper     reaper.Config
	Quotas     quota.Config
	Prices     metering.Prices
	CgroupRoot string // cgroup v1 mount root, for throttling; default /sys/fs/cgroup

	// CheckpointTimeout + CheckpointTimeoutPerGiB × the memory limit bound
	// one memory checkpoint or restore; past it the runtime's helper is
	// killed and the pause falls back to disk (a restore boots from disk).
	CheckpointTimeout       time.Duration
	CheckpointTimeoutPerGiB time.Duration

	// NoUserNS runs new runc sandboxes without a user namespace (root inside
	// is then root on the host, limited by capabilities and seccomp only).
	NoUserNS bool

	// Filesystem mounts sandboxes' root filesystems; nil: overlayfs over
	// the template layers on a sized workspace image (internal/rootfs).
	// Unit tests without root give a plain-directory one (runtime/fake.Dirs).
	Filesystem Filesystem

	// WorkspaceSpares is how many formatted workspace images of the default
	// disk size are kept ready under DataDir/spares for cold creates;
	// 0: DefaultWorkspaceSpares, negative: none (each create formats its own).
	WorkspaceSpares int

	// ActivityRetention is how many activity entries each sandbox keeps
	// (oldest pruned); 0 = activity.DefaultRetention.
	ActivityRetention int

	// ClusterToken verifies API replicas' signed requests (`berth node`,
	// internal/cluster/peer); "" on one host, where any cluster header is
	// refused. ClusterNode is this host's Node name: sandboxes created with
	// a replica's id are bound to it (Attrs.Cluster.Node).
	ClusterToken string
	ClusterNode  string
}

// Filesystem is the lifecycle core's view of a sandbox's root filesystem
// in its directory dir: a workspace made once (Prepare) and mounted again
// over the same lowers on every boot (Remount), unmounted keeping the
// workspace (Teardown, idempotent). internal/rootfs is the real one.
type Filesystem interface {
	Prepare(ctx context.Context, dir string, lowers []string, diskMiB int64, userNS *rootfs.IDMap) (root string, err error)
	Remount(ctx context.Context, dir string, lowers []string, userNS *rootfs.IDMap) (root string, err error)
	Teardown(ctx context.Context, dir string) error
}

// overlayFS is internal/rootfs as a Filesystem; a new workspace of the
// default disk size takes a spare image formatted ahead (New starts them).
type overlayFS struct{ spares *rootfs.Spares }

func (f overlayFS) Prepare(ctx context.Context, dir string, lowers []string, diskMiB int64, m *rootfs.IDMap) (string, error) {
	return f.spares.Prepare(ctx, dir, lowers, diskMiB, m)
}

func (overlayFS) Remount(ctx context.Context, dir string, lowers []string, m *rootfs.IDMap) (string, error) {
	return rootfs.Remount(ctx, dir, lowers, m)
}

func (overlayFS) Teardown(ctx context.Context, dir string) error { return rootfs.Teardown(ctx, dir) }

// DefaultWorkspaceSpares covers a quick run of cold creates (8 × ~1.2 MiB
// on disk); a burst beyond them formats its own, as with none.
const DefaultWorkspaceSpares = 8

// maxSocketPath is sun_path's limit (108) minus the NUL byte.
const maxSocketPath = 107

// Validate checks the config and names the bad key.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		return errs.Field("data_dir", "must be set")
	}
	if !filepath.IsAbs(c.DataDir) {
		return errs.Field("data_dir", "must be an absolute path, got %q", c.DataDir)
	}
	// A unix socket path cannot exceed 107 bytes; the agent socket lives under the data dir.
	sock := filepath.Join(c.DataDir, "sandboxes", "12345678901234567890", "chan", "agent.sock")
	if len(sock) > maxSocketPath {
		return errs.Field("data_dir", "too long (%d bytes): agent socket paths under it would exceed the 107-byte unix socket limit", len(c.DataDir))
	}
	if c.DefaultTTL <= 0 {
		return errs.Field("default_ttl", "must be positive")
	}
	if c.MaxTTL < c.DefaultTTL {
		return errs.Field("max_ttl", "must be at least default_ttl (%s)", c.DefaultTTL)
	}
	if c.CheckpointTimeout < 0 {
		return errs.Field("checkpoint_timeout", "must not be negative")
	}
	if c.CheckpointTimeoutPerGiB < 0 {
		return errs.Field("checkpoint_timeout_per_gib", "must not be negative")
	}
	if c.AgentPath == "" {
		return errs.Field("agent_path", "must be set (berth-agent is looked up beside the berth executable)")
	}
	return c.validateAccounting()
}

func (c *Config) setDefaults() {
	if c.DefaultRuntime == "" {
		c.DefaultRuntime = "runc"
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "default"
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = 15 * time.Minute
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = 24 * time.Hour
	}
	if c.DefaultResources == (sandbox.Resources{}) {
		c.DefaultResources = sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024}
	}
	if c.MaxResources == (sandbox.Resources{}) {
		c.MaxResources = sandbox.Resources{CPUMillis: 16000, MemoryMiB: 65536, DiskMiB: 512 * 1024, Pids: 65536}
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	if c.CheckpointTimeout == 0 {
		c.CheckpointTimeout = 10 * time.Second
	}
	if c.CheckpointTimeoutPerGiB == 0 {
		c.CheckpointTimeoutPerGiB = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Reaper.SetDefaults()
	if c.Prices == (metering.Prices{}) {
		c.Prices = metering.DefaultPrices()
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/sys/fs/cgroup"
	}
	if c.Filesystem == nil {
		c.Filesystem = overlayFS{}
	}
}
