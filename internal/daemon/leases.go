package daemon

import (
	"context"
	"errors"
	"strings"
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
	d.leases = leases.New(leasesCore{d}, d.store, leases.Config{Log: d.log})
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

var errUnchanged = errors.New("unchanged")

// Publish puts the current placeholders into the sandbox's stored env and
// grants (new execs get them through env.json), writes
// /run/berth/leases.env (chan/, host-written, read-only inside) and, when
// refresh, re-registers the proxy's grants.
func (c leasesCore) Publish(ctx context.Context, id string, current map[string]string, file []byte, refresh bool) error {
	sb, err := c.d.store.UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		changed := false
		for i, r := range s.Net.Secrets {
			ph, ok := current[r.Name]
			if !ok {
				continue
			}
			if r.Placeholder != ph {
				s.Net.Secrets[i].Placeholder, changed = ph, true
			}
			if s.Env[r.Name] != ph {
				if s.Env == nil {
					s.Env = map[string]string{}
				}
				s.Env[r.Name], changed = ph, true
			}
		}
		if !changed {
			return errUnchanged
		}
		return nil
	})
	if errors.Is(err, errUnchanged) {
		sb, err = c.d.store.GetSandbox(ctx, id)
	} else if err == nil {
		err = c.d.chans.writeEnv(sb)
	}
	if err != nil {
		return err
	}
	if err := c.d.chans.writeFile(id, "leases.env", file); err != nil {
		return err
	}
	if refresh {
		return c.d.net.RefreshGrants(ctx, sb)
	}
	return nil
}

// Withdraw removes secret's grant from the sandbox.
func (c leasesCore) Withdraw(ctx context.Context, id, secret string) error {
	_, err := c.d.store.UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		out := s.Net.Secrets[:0:0]
		for _, r := range s.Net.Secrets {
			if r.Name != secret {
				out = append(out, r)
			}
		}
		s.Net.Secrets = out
		return nil
	})
	return err
}

// leaseSource is the lease service as host networking sees it.
type leaseSource struct{ d *Daemon }

func (l leaseSource) ProxyLeases(ctx context.Context, sb *sandbox.Sandbox) ([]hostnet.LeaseGrant, error) {
	ls, err := l.d.leases.ProxyLeases(ctx, sb)
	if err != nil {
		return nil, err
	}
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
