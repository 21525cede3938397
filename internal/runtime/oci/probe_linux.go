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
		cache = filepath.Join(o.cfg.ProbeCacheDir, "criu-probe", res.Kernel+"-"+sum[:16]+".json")
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

// trialCheckpoint runs a throwaway busybox container with the sandboxes'
// own spec, checkpoints it with CRIU and restores it, all within
// ProbeTimeout, and removes everything it made. definitive says whether
// the outcome is CRIU's (cacheable) rather than a set-up problem.
func (o *OCI) trialCheckpoint(parent context.Context) (definitive bool, err error) {
	// A state root of its own: the daemon's reconciliation never sees the
	// throwaway container, and a trial cut short by a crash is swept here.
	dir := o.cfg.Root + "-probe"
	probe := &OCI{name: o.name, cfg: o.cfg, log: o.log}
	probe.cfg.Root = filepath.Join(dir, "state")
	sweepProbe(probe, dir)
	defer sweepProbe(probe, dir)
	if err := os.MkdirAll(probe.cfg.Root, 0o700); err != nil {
		return false, err
	}
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		return false, fmt.Errorf("trial checkpoint: build its rootfs: %w", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	spec := runtime.Spec{
		ID: "berth-probe-" + hex.EncodeToString(b[:]), BundleDir: filepath.Join(dir, "bundle"), RootFS: root,
		Args: []string{"/bin/sh", "-c", probeScript}, Resources: runtime.Resources{MemoryBytes: 64 << 20, Pids: 32},
		LogPath: filepath.Join(dir, "runtime.log"),
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
	img := filepath.Join(dir, "image")
	if err := probe.checkpoint(ctx, spec.ID, img); err != nil {
		return bound("checkpoint", err)
	}
	_ = probe.Delete(ctx, spec.ID)
	if err := probe.restore(ctx, spec, img); err != nil {
		return bound("restore", err)
	}
	st, err := probe.State(ctx, spec.ID)
	if err != nil || st.State != "running" || st.Pid <= 0 || syscall.Kill(st.Pid, 0) != nil {
		return true, fmt.Errorf("trial restore of a throwaway container left it %q (%v)", st.State, err)
	}
	return true, nil
}

// sweepProbe removes every container of the probe's state root and its directory.
func sweepProbe(probe *OCI, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if list, err := probe.List(ctx); err == nil {
		for _, c := range list {
			_ = probe.Thaw(ctx, c.ID)
			_ = probe.Delete(ctx, c.ID)
		}
	}
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
