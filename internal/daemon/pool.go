package daemon

import (
	"context"
	"reflect"

	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Warm pools are pool.Service; this file is the core's side of its narrow
// interface (pool.Core) and the names kept for callers of this package.

// PoolOwner owns warm pool members until a create claims one.
const PoolOwner = pool.Owner

type (
	PoolSpec   = pool.Spec
	PoolStatus = pool.Status
)

// IsPoolMember reports whether sb is an unclaimed warm pool member: hidden
// from listings, never expired or reaped.
func IsPoolMember(sb *sandbox.Sandbox) bool { return pool.IsMember(sb) }

// Pools is the warm pool service.
func (d *Daemon) Pools() *pool.Service { return d.poolSvc }

// poolable reports whether a normalized create request differs from the
// plain "template, runtime, resources" request only in what a claim can
// personalise (owner, labels, env, expiry, auto-resume). Anything else — a
// snapshot, a network policy, any field added later — makes it a miss.
func poolable(req CreateRequest) bool {
	k := req
	k.Owner, k.Actor, k.Labels, k.Env, k.TTL, k.ExpiryAction, k.AutoResume, k.Workstation = "", "", nil, nil, 0, "", false, false
	k.ClusterAdopt = false // the binding is written by the claim itself
	return reflect.DeepEqual(k, CreateRequest{Template: req.Template, Runtime: req.Runtime, Resources: req.Resources})
}

// claimFromPool hands out a ready member of pools matching req
// (pool.Service.Claim).
func claimFromPool(ctx context.Context, pools *pool.Service, req CreateRequest, tpl *store.Template, cl sandbox.ClusterState) (*sandbox.Sandbox, bool) {
	return pools.Claim(ctx, pool.ClaimRequest{
		Owner: req.Owner, Actor: req.Actor, Runtime: req.Runtime, Resources: req.Resources,
		Labels: req.Labels, Env: req.Env, TTL: req.TTL, ExpiryAction: req.ExpiryAction, AutoResume: req.AutoResume,
		Poolable: poolable(req), Cluster: cl,
	}, tpl)
}

// poolCore is the core as pool.Core sees it: the primitives are the
// Daemon's (embedded); creating, draining and inspecting members are
// defined on the adapter only, so they are no API of the Daemon.
type poolCore struct{ *Daemon }

var _ pool.Core = poolCore{}

// CreatePoolMember creates one warm pool member.
func (d poolCore) CreatePoolMember(ctx context.Context, spec pool.Spec, m sandbox.PoolState) (*sandbox.Sandbox, error) {
	return d.Create(ctx, CreateRequest{
		Owner: PoolOwner, Actor: "pool", Template: spec.Template, Runtime: spec.Runtime,
		Resources: spec.Resources, TTL: d.cfg.MaxTTL, Attrs: sandbox.Attrs{Pool: m},
	})
}

// DrainPoolMember deletes an unclaimed member.
func (d poolCore) DrainPoolMember(ctx context.Context, id string) error {
	return d.delete(ctx, PoolOwner, id, "pool", "pool_drained")
}

// EnvdTokenHash is the access token hash of sandbox id owned by owner.
func (d poolCore) EnvdTokenHash(id, owner string) string { return d.auth.EnvdTokenHash(id, owner) }

// PublishEnv hands sb's environment to its agent.
func (d poolCore) PublishEnv(sb *sandbox.Sandbox) error { return d.chans.writeEnv(sb) }

// PoolMemberMemory is a member's memory use.
func (d poolCore) PoolMemberMemory(ctx context.Context, rt, id string) (uint64, error) {
	r, ok := d.runtimes[rt]
	if !ok {
		return 0, nil
	}
	s, err := r.Stats(ctx, id)
	return s.MemoryBytes, err
}
