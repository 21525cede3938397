package node

import (
	"context"
	"maps"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Warm pools in cluster mode: a WarmPool object names a template and a
// shape with min and max; every node keeps its own pool of it, sized from
// the claims it sees (placement.Rate over the node's new sandboxes of the
// template, placement.PoolSize), clamped to [min, max], through the local
// daemon's pool service. A node counts demand, not only pool hits: the
// sandboxes the replicas bind here are the claims a pool would serve.

// PoolSizing is the pool sizing of docs/CLUSTER.md (zero fields: the defaults).
type PoolSizing struct {
	Tau     time.Duration // Rate's time constant (30m)
	Refill  time.Duration // time to start a member (2s)
	HitRate float64       // 0.9
	MaxIdle time.Duration // 10m
}

func (p PoolSizing) withDefaults() PoolSizing {
	if p.Tau == 0 {
		p.Tau = 30 * time.Minute
	}
	if p.Refill == 0 {
		p.Refill = 2 * time.Second
	}
	if p.HitRate == 0 {
		p.HitRate = 0.9
	}
	if p.MaxIdle == 0 {
		p.MaxIdle = 10 * time.Minute
	}
	return p
}

// poolState is what the agent keeps between passes.
type poolState struct {
	seen    map[string]bool            // local sandbox ids already counted
	rates   map[string]*placement.Rate // by template name
	managed map[string]int             // template → pool size the agent set
	primed  bool

	shapes map[string]berthv1.WarmPoolSpec // template → the spec that size was set for
}

// Target is one pool's size on this node: PoolSize of the observed rate,
// clamped to [min, max] (max 0: pool.MaxSize).
func Target(s PoolSizing, rate float64, spec berthv1.WarmPoolSpec) int {
	s = s.withDefaults()
	hi := int(spec.Max)
	if hi <= 0 || hi > pool.MaxSize {
		hi = pool.MaxSize
	}
	lo := min(max(int(spec.Min), 0), hi)
	n := placement.PoolSize(placement.PoolInput{Rate: rate, Refill: s.Refill, HitRate: s.HitRate, MaxIdle: s.MaxIdle, Max: hi})
	return min(max(n, lo), hi)
}

// syncPools is one pass: count new claims, size and set each WarmPool's
// local pool, drop the pools of WarmPools gone, report ready members.
func (a *Agent) syncPools(ctx context.Context) {
	var l berthv1.WarmPoolList
	if err := a.cfg.Kube.List(ctx, berthv1.WarmPools, a.cfg.Namespace, kube.ListOptions{}, &l); err != nil {
		if ctx.Err() == nil {
			a.log.Warn("list warm pools", "err", err)
		}
		return
	}
	local, _, err := a.cfg.Daemon.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		a.log.Warn("list local sandboxes", "err", err)
		return
	}
	now := a.cfg.Now()
	ps := &a.pools
	sizing := a.cfg.PoolSizing.withDefaults()
	// Claims: local sandboxes of a template not seen before (pool members
	// are supply, not demand). The first pass only primes the set.
	var fresh []*sandbox.Sandbox
	live := map[string]bool{}
	for _, sb := range local {
		live[sb.ID] = true
		if ps.seen[sb.ID] || pool.IsMember(sb) {
			continue
		}
		ps.seen[sb.ID] = true
		if ps.primed {
			fresh = append(fresh, sb)
		}
	}
	ps.primed = true
	maps.DeleteFunc(ps.seen, func(id string, _ bool) bool { return !live[id] })
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].CreatedAt.Before(fresh[j].CreatedAt) })
	for _, sb := range fresh {
		r := ps.rates[sb.Template]
		if r == nil {
			r = &placement.Rate{Tau: sizing.Tau}
			ps.rates[sb.Template] = r
		}
		r.Observe(now) // observed now: times must not go backwards, and a pass is at most seconds late
	}

	statuses, err := a.cfg.Daemon.Pools().List(ctx)
	if err != nil {
		a.log.Warn("list local pools", "err", err)
		return
	}
	ready := map[string]int{}
	for _, st := range statuses {
		ready[st.Template] = st.Ready
	}
	want := map[string]bool{}
	for i := range l.Items {
		wp := &l.Items[i]
		spec := wp.Spec
		if spec.Template == "" || want[spec.Template] {
			continue // one pool per template: the first WarmPool by name wins
		}
		want[spec.Template] = true
		rate := 0.0
		if r := ps.rates[spec.Template]; r != nil {
			rate = r.At(now)
		}
		n := Target(sizing, rate, spec)
		if ps.shapes == nil {
			ps.shapes = map[string]berthv1.WarmPoolSpec{}
		}
		// A new shape or runtime (a replica's PUT) is set again even at the
		// same size.
		if prev, ok := ps.managed[spec.Template]; !ok || prev != n || ps.shapes[spec.Template] != spec {
			if n > 0 {
				// Off the loop (a layer fetch takes long; the Lease must not
				// wait): the pool fills once the template is here.
				name, tpl := wp.Name, spec.Template
				a.background("pool-"+tpl, func(bctx context.Context) {
					if err := a.ensureTemplate(bctx, tpl); err != nil {
						a.log.Warn("warm pool template", "warm_pool", name, "template", tpl, "err", err)
					}
					a.cfg.Daemon.Pools().Wake()
				})
			}
			r := spec.Resources
			_, err := a.cfg.Daemon.Pools().Set(ctx, pool.Spec{Template: spec.Template, Size: n, Runtime: spec.Runtime,
				Resources: sandbox.Resources{CPUMillis: int(r.CPUMillis), MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB, Pids: r.Pids}})
			if err != nil {
				a.log.Warn("set warm pool", "warm_pool", wp.Name, "template", spec.Template, "err", err)
				continue
			}
			a.log.Info("warm pool sized", "warm_pool", wp.Name, "template", spec.Template, "size", n, "claims_per_min", rate*60)
			ps.managed[spec.Template] = n
			ps.shapes[spec.Template] = spec
		}
		a.reportPool(ctx, wp, int32(ready[spec.Template]))
	}
	for tpl := range ps.managed {
		if want[tpl] {
			continue
		}
		if err := a.cfg.Daemon.Pools().Remove(ctx, tpl); err != nil && !errs.Is(err, errs.NotFound) {
			a.log.Warn("remove warm pool", "template", tpl, "err", err)
			continue
		}
		delete(ps.managed, tpl)
		delete(ps.shapes, tpl)
	}
}

// reportPool writes this node's ready count into the WarmPool's status:
// the whole object, conditional on its resourceVersion (WarmPool has no
// status subresource), re-read and retried on a conflict.
func (a *Agent) reportPool(ctx context.Context, wp *berthv1.WarmPool, ready int32) {
	for attempt := 0; attempt < 3; attempt++ {
		if cur, ok := wp.Status.PerNode[a.cfg.Name]; ok && cur == ready {
			return
		}
		if wp.Status.PerNode == nil {
			wp.Status.PerNode = map[string]int32{}
		}
		wp.Status.PerNode[a.cfg.Name] = ready
		var sum int32
		for _, n := range wp.Status.PerNode {
			sum += n
		}
		wp.Status.Ready = sum
		err := a.cfg.Kube.Update(ctx, berthv1.WarmPools, a.cfg.Namespace, wp.Name, wp, nil)
		if err == nil || !errs.Is(err, errs.Conflict) {
			if err != nil && !errs.Is(err, errs.NotFound) {
				a.log.Warn("warm pool status", "warm_pool", wp.Name, "err", err)
			}
			return
		}
		var fresh berthv1.WarmPool
		if err := a.cfg.Kube.Get(ctx, berthv1.WarmPools, a.cfg.Namespace, wp.Name, &fresh); err != nil {
			return
		}
		*wp = fresh
	}
}
