package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/effects"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// The side-effect ledger is the effects service's (internal/effects): the
// egress proxy records through it (hostnet.SetLedger) and it hears forks
// and restores on the hook bus. This file keeps the accessor and its adapter.

// Effects is the side-effect ledger.
func (d *Daemon) Effects() *effects.Service { return d.effects }

// effectsCore is what the ledger reaches of the core.
type effectsCore struct{ d *Daemon }

var _ effects.Core = effectsCore{}

func (c effectsCore) Store() store.Store { return c.d.store }

func (c effectsCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}

// newEffects builds the ledger and wires it to the proxy and the hook bus.
func newEffects(d *Daemon) *effects.Service {
	e := effects.New(effectsCore{d}, effects.Config{Log: d.log, Now: d.cfg.Now})
	d.net.SetLedger(e)
	d.hooks.Register("effects", e)
	return e
}
