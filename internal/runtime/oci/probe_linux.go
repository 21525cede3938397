package oci

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
)

// ProbeResult is the verdict of runc's trial checkpoint on this host.
type ProbeResult struct {
	OK     bool      `json:"ok"`
	Reason string    `json:"reason,omitempty"` // why not, if not
	Kernel string    `json:"kernel"`
	CRIU   string    `json:"criu_sha256"`
	At     time.Time `json:"at"`
	Millis int64     `json:"ms"`
	Cached bool      `json:"-"`
}

// probeScript is the trial workload: a shell whose child has its own
// session (a setsid'ed sleep is what CRIU 4.1.1 hung on, on the kernel of
// issue 12), so the trial covers a session leader that is not PID 1.
const probeScript = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & exec sleep 1000"

// StartProbe starts runc's trial checkpoint in the background (once) and
// returns a channel closed when its verdict is in. The trial is bounded by
// ProbeTimeout; a verdict about CRIU itself is cached per kernel release and
// CRIU binary in ProbeCacheDir, so a restart does not pay for it again.
// Cancelling ctx (the server's lifetime) stops the trial and removes its
// container before the channel closes: a server that exits waits for it.
func (o *OCI) StartProbe(ctx context.Context) <-chan struct{} {
	o.probeOnce.Do(func() {
		if o.name != Runc || o.cfg.CRIU == "" || o.cfg.TrustCRIU {
			close(o.probeDone)
			return
		}
		go func() {
			defer close(o.probeDone)
			o.probe = o.runProbe(ctx)
			o.log.Info("runc checkpoint probe", "ok", o.probe.OK, "reason", o.probe.Reason,
				"kernel", o.probe.Kernel, "cached", o.probe.Cached, "ms", o.probe.Millis)
		}()
	})
	return o.probeDone
}

func (o *OCI) runProbe(ctx context.Context) ProbeResult {
	res := ProbeResult{Kernel: kernelRelease(), At: time.Now()}
	sum, err := fileSHA256(o.cfg.CRIU)
	if err != nil {
		res.Reason = "cannot read criu binary: " + err.Error()
		return res
	}
	res.CRIU = sum
	cache := ""
	if o.cfg.ProbeCacheDir != "" {
		cache = filepath.Join(o.cfg.ProbeCacheDir, "criu-probe", res.Kernel+"-"+sum[:16]+o.probeShape()+".json")
		if b, err := os.ReadFile(cache); err == nil {
			var c ProbeResult
			if json.Unmarshal(b, &c) == nil && c.Kernel == res.Kernel && c.CRIU == sum {
				c.Cached = true
				return c
			}
		}
	}
	start := time.Now()
	definitive, err := o.trialCheckpoint(ctx)
	res.Millis = time.Since(start).Milliseconds()
	if err == nil {
		res.OK = true
	} else {
		res.Reason = err.Error()
	}
	if cache != "" && definitive {
		if b, err := json.Marshal(res); err == nil {
			_ = os.MkdirAll(filepath.Dir(cache), 0o755)
			tmp := cache + ".tmp"
			if os.WriteFile(tmp, b, 0o644) == nil {
				_ = os.Rename(tmp, cache)
			}
		}
	}
	return res
}

// probeShape names what the trial covers beyond the kernel and CRIU, so a
// verdict cached for one shape is not taken for another.
func (o *OCI) probeShape() string {
	if o.cfg.ProbeUserNS != nil {
		return "-netns-userns"
	}
	return "-netns"
}

// probeDir holds the trial's state, bundle and root filesystem. With a
// user namespace the mapped root must be able to search every directory
// down to its root filesystem, and the daemon's data dir may not be
// searchable yet when the trial starts: the trial then lives in the temp
// dir, under a name fixed per state root so that a later start sweeps it.
func (o *OCI) probeDir() string {
	if o.cfg.ProbeUserNS == nil {
		return o.cfg.Root + "-probe"
	}
	h := sha256.Sum256([]byte(o.cfg.Root))
	return filepath.Join(os.TempDir(), "berth-criu-probe-"+hex.EncodeToString(h[:6]))
}

// trialCheckpoint runs a throwaway busybox container shaped as the
// sandboxes are — in a network namespace made beforehand on the host, and
// in their user namespace if they have one — checkpoints it with CRIU and
// restores it twice (a restored container must checkpoint again), all
// within ProbeTimeout, and removes everything it made. definitive says
// whether the outcome is CRIU's (cacheable) rather than a set-up problem.
func (o *OCI) trialCheckpoint(parent context.Context) (definitive bool, err error) {
	// A state root of its own: the daemon's reconciliation never sees the
	// throwaway container, and a trial cut short by a crash is swept here.
	dir := o.probeDir()
	probe := &OCI{name: o.name, cfg: o.cfg, log: o.log}
	probe.cfg.Root = filepath.Join(dir, "state")
	// The name is fixed and may sit in the shared temp dir: only a private
	// root-owned directory is swept as a stale trial's, and the trial's own
	// is made anew with Mkdir, which follows nothing a local user planted.
	stale, err := privateRootDir(dir)
	if err != nil {
		return false, fmt.Errorf("trial checkpoint: %w", err)
	}
	if stale {
		sweepProbe(probe, dir)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return false, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return false, fmt.Errorf("trial checkpoint: %w", err)
	}
	defer sweepProbe(probe, dir)
	if err := os.Mkdir(probe.cfg.Root, 0o700); err != nil {
		return false, err
	}
	// Searchable down to the root filesystem and the bundle (CRIU's
	// restore opens the bundle's sysfs from inside the user namespace), as
	// the daemon's sandbox dirs are to the mapped root; nothing readable.
	bundle := filepath.Join(dir, "bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return false, err
	}
	for _, d := range []string{dir, bundle} {
		if err := os.Chmod(d, 0o711); err != nil {
			return false, err
		}
	}
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		return false, fmt.Errorf("trial checkpoint: build its rootfs: %w", err)
	}
	if m := o.cfg.ProbeUserNS; m != nil {
		if err := shiftOwners(root, m.HostID); err != nil {
			return false, fmt.Errorf("trial checkpoint: map its rootfs: %w", err)
		}
	}
	netns := filepath.Join(dir, "netns")
	if err := makeNetns(netns); err != nil {
		return false, fmt.Errorf("trial checkpoint: make its network namespace: %w", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	spec := runtime.Spec{
		ID: "berth-probe-" + hex.EncodeToString(b[:]), BundleDir: bundle, RootFS: root,
		Args: []string{"/bin/sh", "-c", probeScript}, Resources: runtime.Resources{MemoryBytes: 64 << 20, Pids: 32},
		LogPath: filepath.Join(dir, "runtime.log"), NetNSPath: netns, UserNS: o.cfg.ProbeUserNS,
	}
	ctx, cancel := context.WithTimeout(parent, o.cfg.ProbeTimeout)
	defer cancel()
	bound := func(step string, err error) (bool, error) {
		switch {
		case parent.Err() != nil:
			return false, fmt.Errorf("trial %s interrupted: the server is stopping", step)
		case ctx.Err() != nil:
			return true, fmt.Errorf("trial %s of a throwaway container did not finish within %s (CRIU hung; it was killed)", step, o.cfg.ProbeTimeout)
		}
		return true, fmt.Errorf("trial %s of a throwaway container failed: %s", step, tail(err.Error(), 400))
	}
	if err := probe.Run(ctx, spec); err != nil {
		return false, fmt.Errorf("trial checkpoint: start a throwaway container: %w", err)
	}
	for i, again := range []string{"", " again"} {
		img := filepath.Join(dir, fmt.Sprintf("image%d", i))
		if err := probe.checkpoint(ctx, spec.ID, img); err != nil {
			return bound("checkpoint"+again, err)
		}
		_ = probe.Delete(ctx, spec.ID)
		if err := probe.restore(ctx, spec, img); err != nil {
			return bound("restore"+again, err)
		}
		st, err := probe.State(ctx, spec.ID)
		if err != nil || st.State != "running" || st.Pid <= 0 || syscall.Kill(st.Pid, 0) != nil {
			return true, fmt.Errorf("trial restore%s of a throwaway container left it %q (%v)", again, st.State, err)
		}
	}
	return true, nil
}

// shiftOwners adds base to the owner and group of every file under dir (a
// fresh busybox tree), for a container whose ids map from base on.
func shiftOwners(dir string, base uint32) error {
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		return unix.Lchown(p, int(base+st.Uid), int(base+st.Gid))
	})
}

// makeNetns makes a network namespace owned by the host's user namespace,
// with loopback up, bind-mounted at path: what the daemon gives a sandbox.
func makeNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	res := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends in the new netns and dies with
		// the goroutine.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			res <- err
			return
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			res <- err
			return
		}
		res <- loopbackUp()
	}()
	if err := <-res; err != nil {
		_ = unmountNetns(path)
		return err
	}
	return nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// unmountNetns detaches and removes a netns file; a missing one is fine.
func unmountNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sweepProbe removes every container of the probe's state root, the
// mounts a trial makes (its netns, its sysfs) and its directory.
// privateRootDir says whether dir exists as a directory (not a link)
// owned by root and writable by no one else; anything else at dir is an
// error, never followed.
func privateRootDir(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return false, fmt.Errorf("%s exists and is not a private root-owned directory: refusing to use or remove it", dir)
	}
	return true, nil
}

func sweepProbe(probe *OCI, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if list, err := probe.List(ctx); err == nil {
		for _, c := range list {
			_ = probe.Thaw(ctx, c.ID)
			_ = probe.Delete(ctx, c.ID)
		}
	}
	if err := unmountNetns(filepath.Join(dir, "netns")); err != nil {
		probe.log.Warn("remove checkpoint probe netns", "dir", dir, "err", err)
	}
	_ = unix.Unmount(SysfsDir(filepath.Join(dir, "bundle")), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		probe.log.Warn("remove checkpoint probe dir", "dir", dir, "err", err)
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(u.Release[:]), "\x00")
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
