package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// activityCore is the activity service's view of the core (activity.Core).
type activityCore struct{ d *Daemon }

func (c activityCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}

func (c activityCore) Running(ctx context.Context) ([]*sandbox.Sandbox, error) {
	list, _, err := c.d.store.ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running}})
	return list, err
}

func (c activityCore) UpperDir(id string) string { return rootfs.LayoutOf(c.d.SandboxDir(id)).Upper }
