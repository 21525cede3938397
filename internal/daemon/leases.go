package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/leases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Leases is the credential-lease service (internal/leases).
func (d *Daemon) Leases() *leases.Service { return d.leases }

// wireLeases builds the lease service, makes the proxy's grants follow it
// and hooks it to the lifecycle (called once in New, after the network).
func wireLeases(d *Daemon) {
	d.leases = leases.New(leasesCore{d}, d.store, leases.Config{Log: d.log, Auditor: d.audit}) // issue and revoke are audit entries
	d.net.SetLeases(leaseSource{d})
	d.hooks.Register("leases", d.leases)
}

// leasesCore is the lease service's view of the core (leases.Core).
type leasesCore struct{ d *Daemon }

func (c leasesCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c leasesCore) Lock(id string) func() { return c.d.Lock(id) }
func (c leasesCore) Now() time.Time        { return c.d.cfg.Now() }

func (c leasesCore) Scope(ctx context.Context, owner, secret string) (leases.Scope, error) {
	sec, err := c.d.store.GetSecret(ctx, owner, secret)
	if err != nil {
		return leases.Scope{}, err
	}
	name, _, _ := strings.Cut(sec.Header, ":")
	return leases.Scope{Host: sec.Host, Header: strings.TrimSpace(name)}, nil
}

// WriteFiles writes env.json when env (new execs get the current
// placeholder) and /run/berth/leases.env (chan/, host-written, read-only
// inside), side by side.
func (c leasesCore) WriteFiles(sb *sandbox.Sandbox, file []byte, env bool) error {
	var envErr error
	var wg sync.WaitGroup
	if env {
		wg.Go(func() { envErr = c.d.chans.writeEnv(sb) })
	}
	fileErr := c.d.chans.writeFile(sb.ID, "leases.env", file)
	wg.Wait()
	return errors.Join(envErr, fileErr)
}

// Refresh re-registers the proxy's grants of sb (freeze: marks them frozen).
func (c leasesCore) Refresh(ctx context.Context, sb *sandbox.Sandbox, freeze bool) error {
	if freeze {
		c.d.net.FreezeGrants(sb.ID)
		return nil
	}
	return c.d.net.RefreshGrants(ctx, sb)
}

// PrepareProxyLeases opens the secrets of the leases a change computed;
// set registers them with the proxy.
func (c leasesCore) PrepareProxyLeases(ctx context.Context, sb *sandbox.Sandbox, ls []store.Lease) (func() error, error) {
	gs, err := proxyGrants(ls)
	if err != nil {
		return nil, err
	}
	return c.d.net.PrepareLeaseGrants(ctx, sb, gs)
}

// leaseReissuer is the lease service as a resume sees it (checkpoint.Reissuer);
// d.leases is built after the checkpoint service.
type leaseReissuer struct{ d *Daemon }

func (r leaseReissuer) PlanReissue(ctx context.Context, sb *sandbox.Sandbox, actor string) (*leases.Reissue, error) {
	return r.d.leases.PlanReissue(ctx, sb, actor)
}

// leaseSource is the lease service as host networking sees it.
type leaseSource struct{ d *Daemon }

func (l leaseSource) ProxyLeases(ctx context.Context, sb *sandbox.Sandbox) ([]hostnet.LeaseGrant, error) {
	ls, err := l.d.leases.ProxyLeases(ctx, sb)
	if err != nil {
		return nil, err
	}
	return proxyGrants(ls)
}

// proxyGrants is leases as the proxy registers them.
func proxyGrants(ls []store.Lease) ([]hostnet.LeaseGrant, error) {
	out := make([]hostnet.LeaseGrant, 0, len(ls))
	for _, x := range ls {
		st := egress.GrantActive
		switch x.State {
		case store.LeaseFrozen:
			st = egress.GrantFrozen
		case store.LeaseRevoked:
			st = egress.GrantRevoked
		case store.LeaseActive:
		default:
			return nil, errs.E(errs.Internal, "lease %s has state %q", x.ID, x.State)
		}
		out = append(out, hostnet.LeaseGrant{Lease: x.ID, Secret: x.Secret, Host: x.Host, Placeholder: x.Placeholder,
			State: st, Expires: x.ExpiresAt})
	}
	return out, nil
}
