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

func (c activityCore) Running(ctx context.Context) ([]string, error) {
	list, _, err := c.d.store.ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running}})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list))
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids, nil
}

func (c activityCore) UpperDir(id string) string { return rootfs.LayoutOf(c.d.SandboxDir(id)).Upper }
