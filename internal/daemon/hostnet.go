package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Host networking is the hostnet service's; these are the lifecycle's
// calls into it, kept under their old names so the lifecycle code reads
// as before.

// Net is the host networking service (netns, policy, secrets, ports).
func (d *Daemon) Net() *hostnet.Service { return d.net }

// snapshotPolicyKey is the key of a snapshot's Extra holding the policy.
const snapshotPolicyKey = hostnet.SnapshotPolicyKey

func (d *Daemon) netUp(ctx context.Context, sb *sandbox.Sandbox, root string) error {
	return d.net.Up(ctx, sb, root)
}

func (d *Daemon) netDown(ctx context.Context, sb *sandbox.Sandbox) error { return d.net.Down(ctx, sb) }

func (d *Daemon) netTrust(sb *sandbox.Sandbox, root string) { d.net.Trust(sb, root) }

func (d *Daemon) netMounts(sb *sandbox.Sandbox) []runtime.Mount { return d.net.Mounts(sb) }

func (d *Daemon) netnsPath(sb *sandbox.Sandbox) string { return d.net.NetNSPath(sb) }

func (d *Daemon) reconcileNetwork(ctx context.Context) error { return d.net.Reconcile(ctx) }

// inheritedNet is what a fork inherits of its parent's network.
func inheritedNet(parent *sandbox.Sandbox) sandbox.NetState { return hostnet.Inherit(parent) }

// prepareNetwork fills a create request's network part (hostnet.Prepare).
func (d *Daemon) prepareNetwork(ctx context.Context, req *CreateRequest) error {
	r := hostnet.Request{Owner: req.Owner, Network: req.Network, Allow: req.Allow, Deny: req.Deny,
		Secrets: req.Secrets, Env: req.Env, Net: req.Attrs.Net}
	if err := d.net.Prepare(ctx, &r); err != nil {
		return err
	}
	req.Env, req.Attrs.Net = r.Env, r.Net
	return nil
}
