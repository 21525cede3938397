package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/timeline"
)

// timelineCore is the core as timeline.Core sees it: primitives, the
// restart steps (halt, boot, fail, delete) and the checkpoint services'
// small exports (memory image with the sandbox left running, restore onto
// a fresh workspace, upper capture).
type timelineCore struct{ d *Daemon }

var _ timeline.Core = timelineCore{}

func (c timelineCore) Lock(id string) func() { return c.d.Lock(id) }
func (c timelineCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c timelineCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	c.d.Event(ctx, sb, actor, typ, reason, msg, data)
}
func (c timelineCore) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	return c.d.RuntimeFor(sb)
}
func (c timelineCore) SandboxDir(id string) string              { return c.d.SandboxDir(id) }
func (c timelineCore) Store() store.Store                       { return c.d.Store() }
func (c timelineCore) Now() time.Time                           { return c.d.Now() }
func (c timelineCore) UserNS(sb *sandbox.Sandbox) *rootfs.IDMap { return c.d.userns.of(sb) }
func (c timelineCore) AgentClient(id string) *agentapi.Client   { return c.d.AgentClient(id) }
func (c timelineCore) ReserveSnapshot(ctx context.Context, owner string) (func(), error) {
	return c.d.adm.ReserveSnapshot(ctx, owner)
}

// HaltForRestart is halt without the network detach: the processes
// ended and the filesystem unmounted, the sandbox's network attachment
// (netns, veth, address, ruleset) kept for the boot that follows at once
// and, on runsc, refreshed for it (hostnet.Refresh: the old Sentry's
// proxied connections end; eth0 gets back the address and routes the
// Sentry took). Boot's net.Up keeps an attachment it finds, as after a
// memory pause, and applies the stored policy again. Saves the detach and
// re-attach (~30-60 ms of netlink and nftables work) of every rewind and
// promote. Nothing runs in the netns meanwhile; a halt that fails detaches
// it (the boot then attaches afresh), a restart that ends in Fail detaches
// it there (fail halts fully), a rollback halts fully.
func (c timelineCore) HaltForRestart(ctx context.Context, sb *sandbox.Sandbox) error {
	d := c.d
	ph := startPhases()
	var errList []error
	deleted, killErr := d.endProcesses(ctx, sb)
	errList = append(errList, killErr)
	ph.mark("kill_ms")
	// Once no process of the sandbox runs, its namespace is the daemon's
	// alone: refresh it while the runtime and the filesystem are torn down.
	// runc: its processes' sockets closed with them, and the sandbox (no
	// CAP_NET_ADMIN) cannot have changed the namespace: nothing to refresh.
	netErr := make(chan error, 1)
	refresh := func() { netErr <- d.net.Refresh(ctx, sb) }
	if sb.Runtime != "runsc" {
		refresh = func() { netErr <- nil }
	}
	if killErr == nil && !deleted {
		go refresh()
	}
	if rt, err := d.RuntimeFor(sb); err == nil && !deleted {
		errList = append(errList, rt.Delete(ctx, sb.ID))
	}
	ph.mark("runtime_delete_ms")
	errList = append(errList, d.cfg.Filesystem.Teardown(ctx, d.SandboxDir(sb.ID)))
	ph.mark("fs_ms")
	switch {
	case killErr != nil: // processes may run: the namespace is not touched, only detached below
		netErr <- nil
	case deleted: // the runtime's delete ended them
		refresh()
	}
	errList = append(errList, <-netErr)
	ph.mark("net_wait_ms")
	if err := errors.Join(errList...); err != nil {
		// Not sure what the namespace holds: the next boot attaches afresh.
		return errors.Join(err, d.net.Down(ctx, sb))
	}
	ph.log(ctx, d.log, "halt for restart phases", "sandbox_id", sb.ID, "runtime", sb.Runtime)
	return nil
}
func (c timelineCore) Halt(ctx context.Context, sb *sandbox.Sandbox) error {
	ph := startPhases()
	err := c.d.haltPhases(ctx, sb, ph)
	ph.log(ctx, c.d.log, "halt phases", "sandbox_id", sb.ID, "runtime", sb.Runtime)
	return err
}
func (c timelineCore) Boot(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.boot(ctx, sb, nil)
}
func (c timelineCore) Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error) {
	c.d.fail(ctx, sb, reason, cause)
}
func (c timelineCore) Delete(ctx context.Context, owner, id, actor string) error {
	return c.d.delete(ctx, owner, id, actor, "discarded")
}
func (c timelineCore) BootLayers(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	return c.d.snaps.BootLayers(ctx, sb)
}
func (c timelineCore) CaptureUpper(ctx context.Context, sb *sandbox.Sandbox, running bool) (template.Layer, error) {
	return c.d.snaps.CaptureUpper(ctx, sb, running)
}
func (c timelineCore) CheckpointRunning(ctx context.Context, sb *sandbox.Sandbox, img string, capture func(context.Context, bool) error) (bool, string, error) {
	return c.d.ckpt.CheckpointRunning(ctx, sb, img, capture)
}
func (c timelineCore) RestoreInto(ctx context.Context, sb *sandbox.Sandbox, lowers []string, img, imageOf string, diskMiB int64) error {
	return c.d.ckpt.RestoreInto(ctx, sb, lowers, img, imageOf, diskMiB)
}
