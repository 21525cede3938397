package daemon

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The agent channel (agentapi.Channel): the daemon listens on
// chan/<id>/agent.sock under the data dir, a directory only the daemon
// writes (on one tmpfs for all sandboxes, see useShared; sandboxes made
// before it have sandboxes/<id>/chan), mounted read-only at /run/berth
// in the sandbox. Nothing the sandbox can write is on the host's side of it, and the daemon never follows a path
// the sandbox controls. Each sandbox's key is derived from one master key,
// so nothing per sandbox is stored.

// channelKeyFile is the master key of every agent channel, in the data dir.
const channelKeyFile = "channel.key"

// loadChannelKey reads the master key, creating it (0600) on first start.
func loadChannelKey(dataDir string) ([]byte, error) {
	return loadMasterKey(dataDir, channelKeyFile, agentapi.KeySize)
}

// loadMasterKey reads DATA_DIR/name, a key of size random bytes, creating
// it 0600 (written, synced, then linked in) on first start. A link planted
// at the path is not followed.
func loadMasterKey(dataDir, name string, size int) ([]byte, error) {
	p := filepath.Join(dataDir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, size)
		if _, err := rand.Read(key); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "generate %s", name)
		}
		w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "create %s", p)
		}
		_, err = w.Write(key)
		if err == nil {
			err = w.Sync()
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "write %s", p)
		}
		return key, syncDir(dataDir)
	}
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "open %s", p)
	}
	defer f.Close()
	key, err := io.ReadAll(io.LimitReader(f, int64(size)+1))
	if err != nil || len(key) != size {
		return nil, errs.E(errs.FailedPrecondition, "%s must hold %d bytes", p, size)
	}
	return key, auth.PrivateFiles(dataDir, name)
}

// channels is the registry of the daemon's agent channels: one listener
// per sandbox, keyed by sandbox id, under its own lock. mu is a leaf in the
// core's lock order (package doc): it is taken with a sandbox's lock held
// or not, and nothing that takes another lock runs while it is held.
type channels struct {
	key        []byte                 // master key (channelKeyFile)
	sandboxDir func(id string) string // the core's per-sandbox host directory
	log        *slog.Logger
	observe    func(id string) agentapi.Observer // set once in New (activity), before any channel opens
	callers    func(id string, conn net.Conn)    // set once in New (selfapi.go): serves a sandbox's caller connections

	mu sync.Mutex
	m  map[string]*agentapi.Channel
	// gone are the sandboxes whose directory is being removed (and stays
	// so when that failed): no channel dir or listener is made for them.
	// Without it a background caller (the reaper asking an agent) that
	// looked the sandbox up before its delete remade its directory and
	// channel tmpfs after the teardown had removed them, and both leaked.
	gone map[string]struct{}

	// tmpfs: channel dirs live on a tmpfs (with the real filesystem; unit
	// tests on plain directories leave it off): DATA/chan, one tmpfs shared
	// by every sandbox (useShared), or, when that could not be mounted, a
	// small tmpfs of each sandbox's own.
	tmpfs bool
	// shared is the shared tmpfs (DATA/chan) once mounted; a new sandbox's
	// channel dir is shared/<id>. "": each one is sandboxes/<id>/chan.
	shared string
	// legacy are the sandboxes whose channel dir is sandboxes/<id>/chan
	// (made before the shared tmpfs, or without it): a running sandbox's
	// bind mount holds the dir it was started with. Set once in useShared.
	legacy map[string]bool
}

func newChannels(key []byte, sandboxDir func(string) string, log *slog.Logger) *channels {
	return &channels{key: key, sandboxDir: sandboxDir, log: log, m: map[string]*agentapi.Channel{}, gone: map[string]struct{}{}}
}

func (c *channels) agentKey(id string) []byte { return agentapi.DeriveKey(c.key, id) }

// dir is a sandbox's channel dir: shared/<id>, or sandboxes/<id>/chan.
func (c *channels) dir(id string) string {
	if c.shared != "" && !c.legacy[id] {
		return filepath.Join(c.shared, id)
	}
	return c.ownDir(id)
}

func (c *channels) ownDir(id string) string { return filepath.Join(c.sandboxDir(id), "chan") }

// sharedMountOpts bound the shared channel tmpfs; only the daemon writes
// there (a socket, env.json and leases.env per sandbox).
const sharedMountOpts = "mode=0711,size=256m,nr_inodes=262144"

// useShared puts new channel dirs on one tmpfs at dir, mounting it unless
// it already is one (a restart: running sandboxes' dirs are on it). Every
// sandbox's own tmpfs was a mount in the host's table, and a `runc run`
// reads that table several times: at 1,000 sandboxes each mount per
// sandbox is ~1,000 more lines per read. Sandboxes whose channel dir is
// their own (sandboxesDir/<id>/chan) keep it. Called once, before any
// channel is made.
func (c *channels) useShared(dir, sandboxesDir string) error {
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return errs.Wrap(errs.Internal, err, "create %s", dir)
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return errs.E(errs.Internal, "%s is not a directory", dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return errs.Wrap(errs.Internal, err, "statfs %s", dir)
	}
	if !rootfs.IsMountPoint(dir) || st.Type != unix.TMPFS_MAGIC {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, sharedMountOpts); err != nil {
			return errs.Wrap(errs.Internal, err, "mount the channel tmpfs on %s", dir)
		}
	}
	legacy := map[string]bool{}
	entries, _ := os.ReadDir(sandboxesDir)
	for _, e := range entries {
		if fi, err := os.Lstat(filepath.Join(sandboxesDir, e.Name(), "chan")); err == nil && fi.IsDir() {
			legacy[e.Name()] = true
		}
	}
	c.shared, c.legacy = dir, legacy
	return nil
}

// releaseShared unmounts the shared channel tmpfs when no sandbox has a
// channel dir on it (daemon shutdown): with a sandbox left running or
// paused it stays, for the next daemon and the sandbox's bind mount.
func (c *channels) releaseShared() {
	if c.shared == "" {
		return
	}
	entries, err := os.ReadDir(c.shared)
	if err != nil || len(entries) > 0 {
		return
	}
	if err := unix.Unmount(c.shared, unix.UMOUNT_NOFOLLOW); err != nil {
		c.log.Warn("unmount the channel tmpfs", "dir", c.shared, "err", err)
		return
	}
	_ = os.Remove(c.shared)
}

func (c *channels) socketPath(id string) string {
	return filepath.Join(c.dir(id), agentapi.SocketName)
}

// ensureDir creates the channel directory: root-owned, traversable by
// a sandbox root mapped to an unprivileged uid, writable by nobody else.
// The sandbox's own directory is created too (a create, a restore).
func (c *channels) ensureDir(id string) error { return c.makeDir(id, true) }

// makeDir is ensureDir; parent says whether the sandbox's directory may be
// created (else it must exist: the channel of a sandbox that is gone is
// never remade).
func (c *channels) makeDir(id string, parent bool) error {
	if c.dirReady(id) {
		return nil // as made before: one stat, not four calls (every writeFile comes here)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.makeDirLocked(id, parent)
}

func (c *channels) dirReady(id string) bool {
	fi, err := os.Lstat(c.dir(id))
	return err == nil && fi.IsDir() && fi.Mode().Perm() == 0o711
}

// makeDirLocked is makeDir with c.mu held: a removal (removeSandboxDir)
// marks the sandbox gone under c.mu, so none is remade once it started.
func (c *channels) makeDirLocked(id string, parent bool) error {
	if _, ok := c.gone[id]; ok {
		return errs.E(errs.Unavailable, "sandbox %s is being removed from this host", id)
	}
	if c.dirReady(id) {
		return nil
	}
	if parent {
		if err := os.MkdirAll(c.sandboxDir(id), 0o711); err != nil {
			return errs.Wrap(errs.Internal, err, "create sandbox dir")
		}
	} else if fi, err := os.Lstat(c.sandboxDir(id)); err != nil || !fi.IsDir() {
		return errs.E(errs.Unavailable, "sandbox %s has no directory on this host", id)
	}
	dir := c.dir(id)
	err := os.Mkdir(dir, 0o711)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return errs.Wrap(errs.Internal, err, "create channel dir")
	}
	made := err == nil
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return errs.E(errs.Internal, "channel dir %s is not a directory", dir)
	}
	if made && c.tmpfs && c.shared == "" {
		// Without the shared tmpfs, each channel dir is a tmpfs of its own.
		// Its files are replaced on every lease change and env update: on
		// the data dir's journalled filesystem each replacement is a
		// metadata commit (0.1–0.2 ms, slower beside the store's fsync),
		// on a tmpfs a few microseconds. Only a dir made now is mounted on:
		// a running sandbox's bind mount holds the dir it was started
		// with, and a tmpfs over that would hide its socket from it. The
		// mount goes with the sandbox's directory (removeSandboxDir).
		//
		// nosuid and nodev, as the sandbox's bind of it is: a flag the bind
		// lacks would be locked in a user namespace and fail its remount.
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
			"mode=0711,size=4m,nr_inodes=256"); err != nil {
			c.log.Warn("channel dir stays on the data dir's filesystem", "dir", dir, "err", err)
		}
	}
	return errs.Wrap(errs.Internal, os.Chmod(dir, 0o711), "chmod channel dir")
}

// removeSandboxDir closes a sandbox's channel and removes its directory.
// From its start until it succeeds no channel dir or listener is made for
// the sandbox.
func (c *channels) removeSandboxDir(id string) error {
	c.mu.Lock()
	c.gone[id] = struct{}{}
	if ch, ok := c.m[id]; ok {
		delete(c.m, id)
		ch.Close()
	}
	c.mu.Unlock()
	if c.shared != "" {
		if err := os.RemoveAll(filepath.Join(c.shared, id)); err != nil {
			return errs.Wrap(errs.Internal, err, "remove the channel dir of %s", id)
		}
	}
	if err := removeSandboxDir(c.sandboxDir(id)); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.gone, id) // the directory is gone: makeDir refuses by that now
	c.mu.Unlock()
	return nil
}

// removeSandboxDir removes a sandbox's directory, its channel dir's tmpfs
// first (a mount point inside would make the removal fail half way).
func removeSandboxDir(dir string) error {
	chanDir := filepath.Join(dir, "chan")
	if err := unix.Unmount(chanDir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return errs.Wrap(errs.Internal, err, "unmount %s", chanDir)
	}
	return os.RemoveAll(dir)
}

// open (re)creates a sandbox's channel listener before its agent starts.
func (c *channels) open(id string) (*agentapi.Channel, error) {
	if err := c.ensureDir(id); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[id]; ok {
		old.Close()
		delete(c.m, id)
	}
	ch, err := agentapi.Listen(c.socketPath(id), id, c.agentKey(id), c.log.With("sandbox_id", id))
	if err != nil {
		return nil, err
	}
	if c.observe != nil {
		ch.Client().SetObserver(c.observe(id))
	}
	c.serveCallers(id, ch)
	c.m[id] = ch
	return ch, nil
}

// serveCallers hands the channel's caller connections to the in-sandbox
// API as sandbox id: the channel's own sandbox, whoever the caller says it is.
func (c *channels) serveCallers(id string, ch *agentapi.Channel) {
	if c.callers != nil {
		ch.ServeCallers(func(conn net.Conn) { c.callers(id, conn) })
	}
}

// get returns a sandbox's channel, listening again if the daemon has
// none (after a restart its agents redial within a fraction of a second).
func (c *channels) get(id string) (*agentapi.Channel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.m[id]; ok {
		return ch, nil
	}
	// Never recreate the directory of a sandbox that is gone (or going).
	if err := c.makeDirLocked(id, false); err != nil {
		return nil, err
	}
	ch, err := agentapi.Listen(c.socketPath(id), id, c.agentKey(id), c.log.With("sandbox_id", id))
	if err != nil {
		return nil, err
	}
	c.serveCallers(id, ch)
	c.m[id] = ch
	return ch, nil
}

// client returns the agent client of a sandbox.
func (c *channels) client(id string) *agentapi.Client {
	ch, err := c.get(id)
	if err != nil {
		return agentapi.UnreachableClient(err)
	}
	return ch.Client()
}

// drop closes a sandbox's channel (its socket goes with it).
func (c *channels) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock() // no successor listens before this one is gone
	if ch, ok := c.m[id]; ok {
		delete(c.m, id)
		ch.Close()
	}
}

// closeAll closes every channel (daemon shutdown; agents redial the next daemon).
func (c *channels) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, ch := range c.m {
		ch.Close()
		delete(c.m, id)
	}
}

// AgentClient returns the agent client of a sandbox.
func (d *Daemon) AgentClient(id string) *agentapi.Client { return d.chans.client(id) }

// writeEnv publishes the sandbox's default environment to the agent
// (re-read on every exec, so updates apply without a restart). It lands in
// the channel dir, which the sandbox cannot write, through os.Root: no
// symlink is followed even if one appeared there.
func (c *channels) writeEnv(sb *sandbox.Sandbox) error {
	env := map[string]string{}
	for k, v := range sb.Env {
		env[k] = v
	}
	b, err := json.Marshal(env)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode env")
	}
	return c.writeFile(sb.ID, "env.json", b)
}

// writeFile replaces file name in a sandbox's channel dir (read-only inside
// at /run/berth) with b, 0644, atomically.
func (c *channels) writeFile(id, name string, b []byte) error {
	if err := c.makeDir(id, false); err != nil {
		return err
	}
	root, err := os.OpenRoot(c.dir(id))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open channel dir")
	}
	defer root.Close()
	tmp, final := name+".tmp", name
	_ = root.Remove(tmp)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write %s", name)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o644) // readable by a sandbox root mapped to an unprivileged uid
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write %s", name)
	}
	return errs.Wrap(errs.Internal, root.Rename(tmp, final), "write %s", name)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
