package daemon

import (
	"context"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lineage"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Lineage is the view, diff and compare service (internal/lineage).
func (d *Daemon) Lineage() *lineage.Service { return d.lineage }

// lineageCore is what internal/lineage needs of the core.
type lineageCore struct{ d *Daemon }

var _ lineage.Core = lineageCore{}

func (c lineageCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c lineageCore) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	return c.d.RuntimeFor(sb)
}
func (c lineageCore) UserNS(sb *sandbox.Sandbox) *rootfs.IDMap { return c.d.userns.of(sb) }
func (c lineageCore) LayerPath(digest string) string           { return c.d.templates.LayerPath(digest) }
func (c lineageCore) Store() store.Store                       { return c.d.store }

// UpperDir is sb's host upper dir while its workspace is mounted (with
// overlayfs: while its root overlay is mounted; a plain-directory
// filesystem of unit tests: while the dir exists).
func (c lineageCore) UpperDir(sb *sandbox.Sandbox) (string, error) {
	dir := c.d.SandboxDir(sb.ID)
	upper := rootfs.LayoutOf(dir).Upper
	if _, ok := c.d.cfg.Filesystem.(overlayFS); ok {
		if !rootfs.Mounted(dir) {
			return "", errs.E(errs.FailedPrecondition, "the workspace of sandbox %s is not mounted (%s): start or resume it to diff it", sb.ID, sb.State)
		}
		return upper, nil
	}
	if _, err := os.Lstat(upper); err != nil {
		return "", errs.Wrap(errs.FailedPrecondition, err, "the workspace of sandbox %s", sb.ID)
	}
	return upper, nil
}

func (c lineageCore) Agent(ctx context.Context, owner, id string) (*agentapi.Client, error) {
	return c.d.Agent(ctx, owner, id)
}

// Usage is a sandbox's metered usage over its life.
func (c lineageCore) Usage(ctx context.Context, id string) (lineage.Cost, error) {
	rep, err := c.d.adm.Usage(ctx, "", time.Time{}, id)
	if err != nil {
		return lineage.Cost{}, err
	}
	for _, l := range rep.Sandboxes {
		if l.SandboxID == id {
			return lineage.Cost{CPUSeconds: l.CPUSeconds, MemoryGiBSeconds: l.MemGiBSeconds, RunningSeconds: l.RunningSeconds,
				CostActive: l.CostActive, CostReserved: l.CostReserved}, nil
		}
	}
	return lineage.Cost{}, nil
}

func (c lineageCore) Lock(id string) func() { return c.d.Lock(id) }

// MountWorkspace mounts a stopped or paused sandbox's workspace image
// read-only (rootfs.MountWorkspaceReadOnly); a plain-directory filesystem
// of unit tests has its upper dir as it is.
func (c lineageCore) MountWorkspace(ctx context.Context, sb *sandbox.Sandbox) (string, func() error, error) {
	dir := c.d.SandboxDir(sb.ID)
	if _, ok := c.d.cfg.Filesystem.(overlayFS); ok {
		return rootfs.MountWorkspaceReadOnly(ctx, dir)
	}
	upper := rootfs.LayoutOf(dir).Upper
	if _, err := os.Lstat(upper); err != nil {
		return "", nil, errs.Wrap(errs.FailedPrecondition, err, "the workspace of sandbox %s", sb.ID)
	}
	return upper, func() error { return nil }, nil
}
