package daemon

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// poolLoop keeps every warm pool at its target: it adopts members found in
// the store after a restart, drains members made for an old template
// fingerprint or shape, and starts new members with bounded concurrency,
// backing off (and saying why) when the template cannot start.
func (d *Daemon) poolLoop(ctx context.Context) {
	if specs, err := d.poolSpecs(ctx); err == nil {
		d.applyPoolSpecs(specs)
	}
	p := d.pools()
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		d.poolPass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
	}
}

// poolPass is one round of the loop.
func (d *Daemon) poolPass(ctx context.Context) {
	members, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{Owner: PoolOwner, Order: store.OrderAsc})
	if err != nil {
		d.log.Error("pool scan", "err", err)
		return
	}
	p := d.pools()
	byPool := map[string][]*sandbox.Sandbox{}
	for _, m := range members {
		byPool[m.Pool.Member] = append(byPool[m.Pool.Member], m)
	}
	p.mu.Lock()
	names := make([]string, 0, len(p.pools))
	for n := range p.pools {
		names = append(names, n)
	}
	p.mu.Unlock()
	// Members of pools that no longer exist.
	for name, ms := range byPool {
		p.mu.Lock()
		_, ok := p.pools[name]
		p.mu.Unlock()
		if !ok {
			for _, m := range ms {
				d.drainMember(ctx, m, "pool removed")
			}
		}
	}
	for _, name := range names {
		d.poolFill(ctx, name, byPool[name])
	}
}

func (d *Daemon) poolFill(ctx context.Context, name string, members []*sandbox.Sandbox) {
	p := d.pools()
	tpl, tplErr := d.store.GetTemplate(ctx, name)
	p.mu.Lock()
	wp := p.pools[name]
	if wp == nil {
		p.mu.Unlock()
		return
	}
	spec := wp.spec
	if tplErr != nil || tpl.State != store.TemplateReady {
		wp.key, wp.ready, wp.state = "", nil, "waiting"
		wp.lastErr = "template " + name + " is not ready"
		if tplErr != nil {
			wp.lastErr = "template " + name + ": " + tplErr.Error()
		}
		p.mu.Unlock()
		for _, m := range members {
			d.drainMember(ctx, m, "template gone")
		}
		return
	}
	key := d.poolKey(tpl.Fingerprint, spec.Runtime, spec.Resources)
	if wp.key != key && wp.key != "" {
		d.log.Info("pool invalidated: template fingerprint or shape changed", "template", name)
	}
	wp.key = key
	var ready []string
	var stale []*sandbox.Sandbox
	for _, m := range members {
		switch {
		case m.Pool.Key != key || m.TemplateID != tpl.Fingerprint:
			stale = append(stale, m)
		case m.State == sandbox.Running:
			ready = append(ready, m.ID)
		case m.State != sandbox.Creating:
			stale = append(stale, m) // failed, stopped ...
		}
	}
	wp.ready = ready
	if spec.Auto && wp.target > spec.Min && time.Since(wp.lastMiss) > poolShrinkAfter && time.Since(wp.lastResize) > poolShrinkAfter {
		wp.target--
		wp.lastResize = time.Now()
	}
	// Too many (the target shrank): drain the newest surplus.
	for len(wp.ready) > wp.target {
		id := wp.ready[len(wp.ready)-1]
		wp.ready = wp.ready[:len(wp.ready)-1]
		for _, m := range members {
			if m.ID == id {
				stale = append(stale, m)
			}
		}
	}
	need := wp.target - len(wp.ready) - wp.starting
	now := time.Now()
	switch {
	case now.Before(wp.retryAt):
		wp.state = "backoff"
		need = 0
	case need > 0 || wp.starting > 0:
		wp.state = "filling"
	default:
		wp.state, wp.lastErr = "ready", ""
	}
	p.mu.Unlock()
	for _, m := range stale {
		d.drainMember(ctx, m, "template fingerprint or pool shape changed")
	}
	for ; need > 0; need-- {
		select {
		case p.sem <- struct{}{}:
		default:
			return // others are starting; next pass
		}
		p.mu.Lock()
		wp.starting++
		p.mu.Unlock()
		d.GoBackground("pool-member", func(ctx context.Context) {
			defer func() { <-p.sem }()
			d.startMember(ctx, wp, spec, key)
		})
	}
}

// startMember creates one member for wp.
func (d *Daemon) startMember(ctx context.Context, wp *warmPool, spec PoolSpec, key string) {
	p := d.pools()
	sb, err := d.Create(ctx, CreateRequest{
		Owner: PoolOwner, Actor: "pool", Template: spec.Template, Runtime: spec.Runtime,
		Resources: spec.Resources, TTL: d.cfg.MaxTTL,
		Attrs: sandbox.Attrs{Pool: sandbox.PoolState{Member: spec.Template, Key: key}},
	})
	if err == nil {
		// Members never expire; a claim sets the real expiry.
		_, err = d.store.UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
			s.ExpiresAt = s.CreatedAt.AddDate(100, 0, 0)
			return nil
		})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	wp.starting--
	if err != nil {
		wp.failures++
		backoff := time.Second << min(wp.failures-1, 6)
		if backoff > poolBackoffMax {
			backoff = poolBackoffMax
		}
		wp.retryAt = time.Now().Add(backoff)
		wp.lastErr = "cannot start a member: " + shortError(err)
		wp.state = "backoff"
		d.log.Warn("pool member failed to start", "template", spec.Template, "backoff", backoff, "err", err)
		if sb != nil {
			d.drainMember(context.WithoutCancel(ctx), sb, "failed to start")
		}
		return
	}
	wp.failures, wp.retryAt = 0, time.Time{}
	if wp.key == key {
		wp.ready = append(wp.ready, sb.ID)
	}
	p.wake()
}

// drainMember deletes an unclaimed member; a member claimed meanwhile is
// left alone (delete with owner PoolOwner no longer sees it).
func (d *Daemon) drainMember(ctx context.Context, m *sandbox.Sandbox, why string) {
	if err := d.delete(ctx, PoolOwner, m.ID, "pool", "pool_drained"); err != nil {
		d.log.Debug("pool drain", "sandbox_id", m.ID, "why", why, "err", err)
		return
	}
	d.log.Info("pool member drained", "sandbox_id", m.ID, "template", m.Pool.Member, "why", why)
}
