package network

import (
	"context"
	"sync"
	"time"
)

// Ruleset loads are group commits of deltas. Every attach, detach and
// policy update queues the delta that makes the kernel's ruleset follow
// its change: one sandbox's chains and map elements (nl_linux.go), a size
// that does not grow with the number of sandboxes; a load sends every
// delta queued since the last one in one netlink batch, one kernel
// transaction. Attach and Detach change the state under the lock, release
// it and wait in sync for a load that took their delta; one load covers
// every change made while the one before it ran.
//
// The whole ruleset (Plan, one `nft -f`) is loaded at Setup, and instead
// of the deltas whenever the kernel may not hold the state the last load
// rendered: a failed load (a delta that met a ruleset that drifted, a lost
// table) marks it stale, and the same load is retried at once as a whole
// one, so a change's caller sees an error only when the whole ruleset of
// the current state could not be loaded either.
//
// Lock order: Manager.mu, then Manager.nftMu (a load is planned under mu and
// nftMu is taken before mu is released, so loads land in the order of the
// states they render), then loads.mu, a leaf.

// loads is the group-commit bookkeeping of ruleset loads.
type loads struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running bool   // a load is being planned or applied by a sync caller
	covered uint64 // the newest state generation a finished load rendered
	err     error  // that load's outcome
	done    int    // loads finished (any outcome)
	ok      bool   // the newest load succeeded
}

func newLoads() *loads {
	l := &loads{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// note records a finished load of generation g.
func (l *loads) note(g uint64, err error) {
	l.mu.Lock()
	l.done++
	if g >= l.covered {
		l.covered, l.err, l.ok = g, err, err == nil
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// deltaOp is what a delta does to one sandbox's part of the ruleset.
type deltaOp int

const (
	opAttach deltaOp = iota // add its chains and map elements
	opUpdate                // refill its policy chains
	opDetach                // remove its map elements and chains
)

// delta is one change of the ruleset: sb is the sandbox after the change
// (before it, for a detach).
type delta struct {
	op deltaOp
	sb SandboxNet
}

// changedLocked marks a change of the state the ruleset renders, queues
// the deltas that make the kernel follow it and returns the change's
// generation, for sync.
func (m *Manager) changedLocked(ds ...delta) uint64 {
	m.gen++
	m.pending = append(m.pending, ds...)
	return m.gen
}

// sync returns once a load that rendered generation gen (or a later one)
// has finished, with that load's outcome; it makes the load itself when
// none is running. It must be called without m.mu held.
func (m *Manager) sync(ctx context.Context, gen uint64) error {
	l := m.loads
	l.mu.Lock()
	for l.covered < gen {
		if l.running {
			l.cond.Wait()
			continue
		}
		l.running = true
		l.mu.Unlock()
		g, err := m.loadOnce(ctx)
		l.note(g, err)
		l.mu.Lock()
		l.running = false
		l.cond.Broadcast()
	}
	err := l.err
	l.mu.Unlock()
	return err
}

// loadOnce applies the queued deltas (or the whole ruleset, when the
// kernel's is stale): the generation it rendered, and the load's outcome.
// Not bound to one caller's ctx: the load is every waiter's.
func (m *Manager) loadOnce(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for {
		m.mu.Lock()
		g := m.gen
		m.nftMu.Lock()
		ds, script, full, err := m.takeLocked()
		m.mu.Unlock()
		if err == nil {
			err = m.apply(ctx, ds, script)
		}
		m.stale = err != nil
		m.nftMu.Unlock()
		if err == nil || full {
			return g, err
		}
		m.log.Warn("network: ruleset delta failed; loading the whole ruleset", "err", err)
	}
}

// loadLocked is loadOnce under m.mu (UpdatePolicy, Reconcile, Setup):
// full loads the whole ruleset whatever the kernel holds.
func (m *Manager) loadLocked(ctx context.Context, full bool) error {
	m.nftMu.Lock()
	if full {
		m.stale = true
	}
	var err error
	for {
		var ds []delta
		var script string
		ds, script, full, err = m.takeLocked()
		if err == nil {
			err = m.apply(ctx, ds, script)
		}
		m.stale = err != nil
		if err == nil || full {
			break
		}
		m.log.Warn("network: ruleset delta failed; loading the whole ruleset", "err", err)
	}
	m.nftMu.Unlock()
	m.loads.note(m.gen, err)
	return err
}

// takeLocked empties the queue of deltas and returns what a load must
// apply for the current state: the deltas, or the whole ruleset's script
// when the kernel's is stale (full). Called with m.mu and m.nftMu held.
func (m *Manager) takeLocked() (ds []delta, script string, full bool, err error) {
	ds, m.pending = m.pending, nil
	if m.stale {
		script, err = m.planLocked()
		return nil, script, true, err
	}
	return ds, "", false, nil
}

// apply loads the whole ruleset's script, or else the deltas.
func (m *Manager) apply(ctx context.Context, ds []delta, script string) error {
	switch {
	case script != "":
		return nftApply(ctx, script)
	case len(ds) > 0:
		return applyDeltas(m.plan, ds)
	}
	return nil
}

// current reports whether the kernel holds a successful load of generation
// gen (or a later one).
func (l *loads) current(gen uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok && l.covered >= gen
}

// count is how many loads have finished.
func (l *loads) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}
