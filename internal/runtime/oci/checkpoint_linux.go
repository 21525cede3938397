package oci

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
)

// Capabilities reports what this backend can do here. runsc checkpoints
// itself. runc checkpoints only when a trial checkpoint and restore of a
// throwaway container with the configured CRIU works (probe_linux.go):
// `criu check` says "Looks good" on kernels where a real dump hangs.
// While the trial runs, Capabilities waits for it as long as ctx allows
// (a done ctx asks for what is known now: Freeze is, without waiting).
func (o *OCI) Capabilities(ctx context.Context) runtime.Capabilities {
	o.capsOnce.Do(func() {
		o.caps = runtime.Capabilities{Freeze: freezerAvailable(o.cfg.CgroupRoot)}
		if !o.caps.Freeze {
			o.caps.CheckpointReason = "no cgroup freezer"
		}
	})
	caps := o.caps
	switch {
	case o.name == Runsc:
		caps.Checkpoint = true
	case o.cfg.CRIU == "":
		caps.CheckpointReason = "no criu configured for runc"
	case o.cfg.TrustCRIU:
		caps.Checkpoint = true
	default:
		done := o.StartProbe(context.WithoutCancel(ctx))
		select {
		case <-done:
		default:
			select {
			case <-done:
			case <-ctx.Done():
				caps.Checkpoint, caps.CheckpointReason = false, "the trial checkpoint of CRIU is still running"
				return caps
			}
		}
		caps.Checkpoint, caps.CheckpointReason = o.probe.OK, o.probe.Reason
	}
	return caps
}

func freezerAvailable(cgroupRoot string) bool {
	for _, p := range []string{filepath.Join(cgroupRoot, "freezer"), filepath.Join(cgroupRoot, "cgroup.freeze"), filepath.Join(cgroupRoot, "cgroup.controllers")} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// Checkpoint writes the container's memory image to imageDir, stops the
// container's processes and syncs the image before returning; Delete
// removes what is left of the container.
func (o *OCI) Checkpoint(ctx context.Context, id, imageDir string) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	if !filepath.IsAbs(imageDir) {
		return errs.Field("image_dir", "must be an absolute path, got %q", imageDir)
	}
	if c := o.Capabilities(ctx); !c.Checkpoint {
		return errs.E(errs.FailedPrecondition, "%s cannot checkpoint on this host: %s", o.name, c.CheckpointReason)
	}
	return o.checkpoint(ctx, id, imageDir)
}

// checkpoint is Checkpoint without the capability check (the probe uses it).
// ctx bounds it: when ctx ends, the runtime and its helpers (CRIU, runsc's
// checkpoint process) are killed as a process group.
func (o *OCI) checkpoint(ctx context.Context, id, imageDir string) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create image dir")
	}
	switch o.name {
	case Runc:
		work := imageDir + ".work"
		defer os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return errs.Wrap(errs.Internal, err, "create criu work dir")
		}
		netns, err := o.joinedNetns(ctx, id)
		if err != nil {
			return err
		}
		err = inNetnsIf(netns, func() error {
			_, err := o.exec(ctx, false, "checkpoint", id, "--criu", o.cfg.CRIU,
				"checkpoint", "--image-path", imageDir, "--work-path", work, id)
			return err
		})
		if err != nil {
			return withCRIULog(err, filepath.Join(work, "dump.log"))
		}
	case Runsc:
		// A restore still loading pages in the background: the Sentry
		// would wait for it too (pgalloc's SaveTo), but waiting here keeps
		// a failed load berth's error and the image's readers counted.
		if err := o.WaitPagesLoaded(ctx, id); err != nil && !errs.Is(err, errs.NotFound) {
			return err
		}
		// Uncompressed (runsc's default, said here because a lazy restore
		// depends on it: --background has no effect on a compressed image).
		if _, err := o.exec(ctx, false, "checkpoint", id,
			"checkpoint", "--direct", "--compression=none", "--image-path", imageDir, id); err != nil {
			return err
		}
	}
	// runc destroys a checkpointed container; runsc still lists it until
	// Delete, which takes ~300 ms there — the caller deletes it once the
	// pause has been answered (the processes are already gone).
	return syncTree(imageDir)
}

// Restore starts container spec.ID from imageDir. The spec must match the
// checkpointed one apart from ID, BundleDir and RootFS; restoring one image
// several times forks it. runsc returns before every memory page is read:
// imageDir must stay until WaitPagesLoaded(spec.ID) returns.
func (o *OCI) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if !filepath.IsAbs(imageDir) {
		return errs.Field("image_dir", "must be an absolute path, got %q", imageDir)
	}
	if c := o.Capabilities(ctx); !c.Checkpoint {
		return errs.E(errs.FailedPrecondition, "%s cannot restore on this host: %s", o.name, c.CheckpointReason)
	}
	return o.restore(ctx, spec, imageDir)
}

// restore is Restore without the capability check (the probe uses it).
func (o *OCI) restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if _, err := os.Stat(imageDir); err != nil {
		return errs.Wrap(errs.NotFound, err, "memory image")
	}
	if err := o.writeBundle(spec); err != nil {
		return err
	}
	done, err := hostSysfs(spec)
	if err != nil {
		return err
	}
	lazy := o.name == Runsc && lazyRestore(imageDir)
	switch o.name {
	case Runc:
		work := filepath.Join(spec.BundleDir, "criu-restore")
		if err = os.MkdirAll(work, 0o700); err != nil {
			return errs.Wrap(errs.Internal, err, "create criu work dir")
		}
		if spec.UserNS != nil {
			// CRIU opens some images (timens, tty) from tasks already in
			// the sandbox's user namespace: they need search on the dir.
			// Its parents (the sandbox dir) keep others out.
			if err = os.Chmod(imageDir, 0o711); err != nil {
				return errs.Wrap(errs.Internal, err, "open memory image to the user namespace")
			}
		}
		err = inNetnsIf(spec.NetNSPath, func() error {
			return o.execDetached(ctx, false, "restore", spec.ID, logPath(spec), "--criu", o.cfg.CRIU,
				"restore", "--detach", "--image-path", imageDir, "--work-path", work,
				"--bundle", spec.BundleDir, spec.ID)
		})
		if err != nil {
			err = withCRIULog(err, filepath.Join(work, "restore.log"))
		} else {
			os.RemoveAll(work)
		}
	case Runsc:
		args := []string{"restore", "--direct", "--detach", "--image-path", imageDir}
		if lazy {
			// restore returns once the kernel state is loaded and the memory
			// pages follow while the sandbox runs (pageload_linux.go).
			args = append(args, "--background")
		}
		err = o.execDetached(ctx, spec.NetNSPath != "", "restore", spec.ID, logPath(spec),
			append(args, "--bundle", spec.BundleDir, spec.ID)...)
	}
	if err = errors.Join(err, done()); err != nil {
		return o.undoStart(spec.ID, err)
	}
	if lazy {
		o.trackPageLoad(spec.ID, imageDir)
	}
	return nil
}

// runc's CRIU runs in the network namespace a sandbox joins by path, for
// checkpoint and restore alike. A namespace CRIU shares with its target is
// the host's to CRIU: it neither dumps it nor recreates it, the restored
// tasks inherit it from CRIU, and its sockets are locked and dumped where
// they live. Otherwise CRIU takes the joined netns as an external one,
// which a sandbox in a user namespace cannot have: the dump requires every
// namespace to belong to the sandbox's user namespace ("One or more
// namespaces doesn't belong to the target user namespace"), and a restore
// would enter the netns from inside the user namespace it has just made,
// which has no say over a netns of the host's. (runc's own netns handling,
// --external net[INODE]:extRootNetNS, still applies: with the netns CRIU's
// own, it names nothing in the image.) The netns stays the daemon's, with
// its veth and nftables rules; a memory fork restores into its own.
func inNetnsIf(netns string, fn func() error) error {
	if netns == "" {
		return fn()
	}
	// Its own goroutine: the runtime is forked from the locked thread, in
	// the netns, and a thread that cannot switch back dies with it.
	res := make(chan error, 1)
	go func() {
		var ferr error
		err := inNetns(netns, func() error { ferr = fn(); return nil })
		if err != nil {
			err = errs.Wrap(errs.Internal, err, "enter network namespace %s", netns)
		}
		res <- errors.Join(ferr, err)
	}()
	return <-res
}

// joinedNetns is the network namespace path container id's config.json
// joins, "" if it has its own. The bundle is the daemon's (runc's state
// names it); nothing in it is the sandbox's to write.
func (o *OCI) joinedNetns(ctx context.Context, id string) (string, error) {
	st, err := o.state(ctx, id)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "read config of %s", id)
	}
	var cfg specs.Spec
	if err := json.Unmarshal(b, &cfg); err != nil {
		return "", errs.Wrap(errs.Internal, err, "decode config of %s", id)
	}
	if cfg.Linux == nil {
		return "", nil
	}
	for _, ns := range cfg.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			if ns.Path != "" && !filepath.IsAbs(ns.Path) {
				return "", errs.E(errs.Internal, "config of %s joins netns %q, not an absolute path", id, ns.Path)
			}
			return ns.Path, nil
		}
	}
	return "", nil
}

// withCRIULog appends the tail of CRIU's log to err: runc itself only says
// "criu failed".
func withCRIULog(err error, logFile string) error {
	b, rerr := os.ReadFile(logFile)
	if rerr != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return errs.Wrap(errs.KindOf(err), err, "criu log %s:\n%s\n", logFile, strings.Join(lines, "\n"))
}

// syncTree fsyncs every file and directory under dir, so an image is
// durable when Checkpoint returns.
func syncTree(dir string) error {
	var all []error
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			all = append(all, err)
			return nil
		}
		if err := f.Sync(); err != nil {
			all = append(all, err)
		}
		f.Close()
		return nil
	})
	if err := errors.Join(append(all, err)...); err != nil {
		return errs.Wrap(errs.Internal, err, "sync memory image %s", dir)
	}
	if d, err := os.Open(filepath.Dir(dir)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
