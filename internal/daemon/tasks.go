package daemon

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/tasks"
)

// Tasks is the task ledger service (internal/tasks).
func (d *Daemon) Tasks() *tasks.Service { return d.tasks }

// tasksCore is the core as the task ledger sees it (tasks.Core).
type tasksCore struct{ d *Daemon }

func (c tasksCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c tasksCore) Store() store.Store { return c.d.store }
func (c tasksCore) Now() time.Time     { return c.d.Now() }
