package daemon

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// A durability barrier for a sandbox's workspace taken on the host: one
// syncfs(2) of the workspace image's filesystem (its ext4, loop-mounted at
// sandboxes/<id>/ws), which holds the overlay upper dir every write of the
// sandbox's root filesystem lands in.
//
// Why on the host: inside gVisor, syncfs is an fsync of every file the
// sentry holds open on the root filesystem, one host round trip each (a
// batch of 1000 small files: ~1 s), where the kernel's syncfs of the same
// filesystem is one journal commit (~30 ms). It gives the same promise
// because, with --overlay2=none, gVisor keeps no dirty data of its own for
// the files the agent writes: a write to a range the sentry has not cached
// (always so for the agent's new, write-only files, which are never read or
// mapped) goes straight to the host file (gofer dentryReadWriter.
// WriteFromBlocks), and creates, chowns, chmods and renames are host
// syscalls. TestFilesBatchHostBarrier reads the files from the host the
// moment the batch answers.
//
// Nothing beneath the mount point is resolved: the barrier opens the mount
// point itself (sandboxes/<id>/ws, host-owned directories only) without
// following a symbolic link, and checks that it is a mount: a sandbox whose
// image is not mounted there gets no host barrier (the agent syncs itself).

// WorkspaceBarrier reports whether SyncWorkspace can take the barrier for
// sandbox id (its workspace image is mounted).
func (d *Daemon) WorkspaceBarrier(id string) bool {
	fd, err := d.openWorkspace(id)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// SyncWorkspace flushes sandbox id's workspace filesystem to its disk
// image and returns how long it took.
func (d *Daemon) SyncWorkspace(id string) (time.Duration, error) {
	start := time.Now()
	fd, err := d.openWorkspace(id)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return 0, errs.Wrap(errs.Internal, err, "syncfs the workspace of sandbox %s", id)
	}
	return time.Since(start), nil
}

// openWorkspace opens the mount point of id's workspace image.
func (d *Daemon) openWorkspace(id string) (int, error) {
	if !sandbox.ValidID(id) {
		return -1, errs.Field("id", "%q is not a sandbox id", id)
	}
	l := rootfs.LayoutOf(d.SandboxDir(id))
	dir, err := unix.Open(l.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errs.Wrap(errs.FailedPrecondition, err, "open the directory of sandbox %s", id)
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, "ws", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, errs.Wrap(errs.FailedPrecondition, err, "open the workspace of sandbox %s", id)
	}
	var pst, wst unix.Stat_t
	if err := errors.Join(unix.Fstat(dir, &pst), unix.Fstat(fd, &wst)); err != nil {
		_ = unix.Close(fd)
		return -1, errs.Wrap(errs.Internal, err, "stat the workspace of sandbox %s", id)
	}
	if pst.Dev == wst.Dev {
		_ = unix.Close(fd)
		return -1, errs.E(errs.FailedPrecondition, "the workspace image of sandbox %s is not mounted", id)
	}
	return fd, nil
}
