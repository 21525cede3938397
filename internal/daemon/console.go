package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/console"
)

// Console is the web console's service (sessions, assets, cookie auth).
func (d *Daemon) Console() *console.Service { return d.console }

// consoleCore is the console's view of the daemon: the API key check.
type consoleCore struct{ d *Daemon }

func (c consoleCore) Authenticate(ctx context.Context, key string) (auth.Principal, error) {
	return c.d.auth.Authenticate(ctx, key)
}
