package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Host networking is the hostnet service's; the lifecycle calls it
// directly (d.net.Up, d.net.Down, ...). This file keeps the accessor and
// the two helpers that translate the core's types.

// Net is the host networking service (netns, policy, secrets, ports).
func (d *Daemon) Net() *hostnet.Service { return d.net }

// snapshotPolicyKey is the key of a snapshot's Extra holding the policy.
const snapshotPolicyKey = hostnet.SnapshotPolicyKey

// inheritedNet is what a fork inherits of its parent's network.
func inheritedNet(parent *sandbox.Sandbox) sandbox.NetState { return hostnet.Inherit(parent) }

// prepareNetwork fills a create request's network part (hostnet.Prepare).
func prepareNetwork(ctx context.Context, net *hostnet.Service, req *CreateRequest) error {
	r := hostnet.Request{Owner: req.Owner, Network: req.Network, Allow: req.Allow, Deny: req.Deny,
		Secrets: req.Secrets, Env: req.Env, Net: req.Attrs.Net, Effects: req.Effects}
	if err := net.Prepare(ctx, &r); err != nil {
		return err
	}
	req.Env, req.Attrs.Net = r.Env, r.Net
	return nil
}
