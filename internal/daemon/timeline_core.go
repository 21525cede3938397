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
func (c timelineCore) Halt(ctx context.Context, sb *sandbox.Sandbox) error { return c.d.halt(ctx, sb) }

// HaltForRestart is halt without the network detach: PID 1 stopped and
// the filesystem unmounted, the sandbox's network attachment (netns,
// address, policy) left in place for the boot that follows at once —
// Boot's net.Up keeps an attachment it finds, as after a memory pause,
// and applies the stored policy again. Saves the detach and re-attach
// (~40 ms of ip/nft commands on a loaded host) of every runc rewind and
// promote (runsc halts fully: timeline.haltForRestart). Nothing runs in the netns meanwhile; a restart that ends in
// Fail detaches it there (fail halts fully), a rollback halts fully.
func (c timelineCore) HaltForRestart(ctx context.Context, sb *sandbox.Sandbox) error {
	d := c.d
	d.chans.drop(sb.ID)
	var errList []error
	if rt, err := d.RuntimeFor(sb); err == nil {
		if err := rt.Delete(ctx, sb.ID); err != nil {
			errList = append(errList, err)
		}
	} else {
		errList = append(errList, err)
	}
	if err := d.cfg.Filesystem.Teardown(ctx, d.SandboxDir(sb.ID)); err != nil {
		errList = append(errList, err)
	}
	return errors.Join(errList...)
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
