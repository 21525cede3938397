package daemon

import (
	"context"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/lineage"
	"github.com/berth-dev/berth/internal/merges"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Merges is the merge service (fork → target, conflicts, apply, recovery).
func (d *Daemon) Merges() *merges.Service { return d.merges }

// newMerges builds the merge service. BERTH_TEST_MERGE_PAUSE (a duration)
// holds every merge commit after its first step: the e2e test that kills
// the daemon mid-merge sets it; nothing else should.
func newMerges(d *Daemon) *merges.Service {
	var pause time.Duration
	if v := os.Getenv("BERTH_TEST_MERGE_PAUSE"); v != "" {
		if p, err := time.ParseDuration(v); err == nil {
			pause = p
			d.log.Warn("BERTH_TEST_MERGE_PAUSE is set: merge commits pause after their first step", "pause", p)
		}
	}
	return merges.New(mergeCore{d}, merges.Config{DataDir: d.cfg.DataDir, Log: d.log, PauseAfterStep: pause})
}

// mergeCore is the core as the merge service sees it (merges.Core).
type mergeCore struct{ d *Daemon }

func (c mergeCore) Lock(id string) func() { return c.d.Lock(id) }
func (c mergeCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c mergeCore) Store() store.Store { return c.d.store }
func (c mergeCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	c.d.Event(ctx, sb, actor, typ, reason, msg, data)
}
func (c mergeCore) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	return c.d.RuntimeFor(sb)
}
func (c mergeCore) SandboxDir(id string) string              { return c.d.SandboxDir(id) }
func (c mergeCore) UserNS(sb *sandbox.Sandbox) *rootfs.IDMap { return c.d.userns.of(sb) }
func (c mergeCore) LayerPath(digest string) string           { return c.d.templates.LayerPath(digest) }
func (c mergeCore) AgentClient(id string) *agentapi.Client   { return c.d.AgentClient(id) }
func (c mergeCore) Now() time.Time                           { return c.d.Now() }

func (c mergeCore) View(ctx context.Context, sb *sandbox.Sandbox) (lineage.View, error) {
	return c.d.lineage.View(ctx, sb)
}
func (c mergeCore) LayersView(layers []string) (lineage.View, error) {
	return c.d.lineage.LayersView(layers)
}

func (c mergeCore) Capture(ctx context.Context, owner, actor, id string) (store.Snapshot, error) {
	return c.d.snaps.Snapshot(ctx, checkpoint.SnapshotRequest{Owner: owner, Actor: actor, ID: id})
}
func (c mergeCore) DropSnapshot(ctx context.Context, id string) error {
	return c.d.snaps.DeleteSnapshot(ctx, "", id)
}
