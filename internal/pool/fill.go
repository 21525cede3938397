package pool

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Run keeps every warm pool at its target until ctx ends: it adopts
// members found in the store after a restart, drains members made for an
// old template fingerprint or shape, and starts new members with bounded
// concurrency, backing off (and saying why) when the template cannot start.
func (s *Service) Run(ctx context.Context) {
	if specs, err := s.specs(ctx); err == nil {
		s.apply(specs)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		s.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// Pass is one round of the loop: it plans every pool from the store's
// members and applies the plans.
func (s *Service) Pass(ctx context.Context) {
	s.mu.Lock()
	taken := s.taken
	s.mu.Unlock()
	members, _, err := s.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: Owner, Order: store.OrderAsc})
	if err != nil {
		s.log.Error("pool scan", "err", err)
		return
	}
	byPool := map[string][]*sandbox.Sandbox{}
	for _, m := range members {
		byPool[m.Pool.Member] = append(byPool[m.Pool.Member], m)
	}
	s.mu.Lock()
	names := make([]string, 0, len(s.pools))
	for n := range s.pools {
		names = append(names, n)
	}
	s.mu.Unlock()
	// Members of pools that no longer exist.
	for name, ms := range byPool {
		s.mu.Lock()
		_, ok := s.pools[name]
		s.mu.Unlock()
		if !ok {
			for _, m := range ms {
				s.drain(ctx, m.ID, name, whyRemoved)
			}
		}
	}
	for _, name := range names {
		s.fill(ctx, name, byPool[name], taken)
	}
}

// fill plans one pool and applies the plan.
func (s *Service) fill(ctx context.Context, name string, members []*sandbox.Sandbox, taken uint64) {
	tpl, tplErr := s.core.Store().GetTemplate(ctx, name)
	s.mu.Lock()
	wp := s.pools[name]
	if wp == nil {
		s.mu.Unlock()
		return
	}
	spec := wp.spec
	var t Template
	switch {
	case tplErr != nil:
		t.Err = "template " + name + ": " + tplErr.Error()
	case tpl.State != store.TemplateReady:
		t.Err = "template " + name + " is not ready"
	default:
		t = Template{Ready: true, Fingerprint: tpl.Fingerprint, Key: s.key(tpl.Fingerprint, spec.Runtime, spec.Resources)}
	}
	ms := make([]Member, len(members))
	for i, m := range members {
		ms[i] = Member{ID: m.ID, Key: m.Pool.Key, TemplateID: m.TemplateID, State: m.State}
	}
	now := s.now()
	a := Plan(now, spec, State{Key: wp.key, Target: wp.target, Starting: wp.starting, RetryAt: wp.retryAt,
		LastMiss: wp.lastMiss, LastResize: wp.lastResize}, t, ms)
	if a.Invalidated {
		s.log.Info("pool invalidated: template fingerprint or shape changed", "template", name)
	}
	if s.taken != taken {
		// A claim took a member after the scan: keep only those still
		// ready (members started since are added as they come up).
		a.Ready = slices.DeleteFunc(a.Ready, func(id string) bool { return !slices.Contains(wp.ready, id) })
	}
	wp.key, wp.ready, wp.target, wp.state = a.Key, a.Ready, a.Target, a.Status
	if a.Resized {
		wp.lastResize = now
	}
	if a.SetErr {
		wp.lastErr = a.Err
	}
	s.mu.Unlock()
	for _, d := range a.Drain {
		s.drain(ctx, d.ID, name, d.Why)
	}
	for need := a.Create; need > 0; need-- {
		select {
		case s.sem <- struct{}{}:
		default:
			return // others are starting; next pass
		}
		s.mu.Lock()
		wp.starting++
		s.mu.Unlock()
		key := a.Key
		s.core.GoBackground("pool-member", func(ctx context.Context) {
			defer func() { <-s.sem }()
			s.startMember(ctx, wp, spec, key)
		})
	}
}

// startMember creates one member for wp.
func (s *Service) startMember(ctx context.Context, wp *warmPool, spec Spec, key string) {
	sb, err := s.core.CreatePoolMember(ctx, spec, sandbox.PoolState{Member: spec.Template, Key: key})
	if err == nil {
		// Members never expire; a claim sets the real expiry.
		_, err = s.core.Store().UpdateSandbox(ctx, sb.ID, func(m *sandbox.Sandbox) error {
			m.ExpiresAt = m.CreatedAt.AddDate(100, 0, 0)
			return nil
		})
	}
	s.mu.Lock()
	wp.starting--
	if err != nil {
		wp.failures++
		backoff := Backoff(wp.failures)
		wp.retryAt = s.now().Add(backoff)
		wp.lastErr = "cannot start a member: " + errs.Short(err)
		wp.state = StateBackoff
		s.mu.Unlock()
		s.log.Warn("pool member failed to start", "template", spec.Template, "backoff", backoff, "err", err)
		if sb != nil {
			s.drain(context.WithoutCancel(ctx), sb.ID, spec.Template, whyStartFailed)
		}
		return
	}
	wp.failures, wp.retryAt = 0, time.Time{}
	if wp.key == key {
		wp.ready = append(wp.ready, sb.ID)
	}
	s.mu.Unlock()
	s.Wake()
}

// drain deletes an unclaimed member of pool name; a member claimed
// meanwhile is left alone.
func (s *Service) drain(ctx context.Context, id, name, why string) {
	if err := s.core.DrainPoolMember(ctx, id); err != nil {
		s.log.Debug("pool drain", "sandbox_id", id, "why", why, "err", err)
		return
	}
	s.log.Info("pool member drained", "sandbox_id", id, "template", name, "why", why)
}
