package network

import (
	"context"
	"sync"
	"time"
)

// Ruleset loads are group commits. Every attach and detach changes the
// whole ruleset (Plan renders it from every attached sandbox, loaded in one
// `nft -f` transaction), and a load is an exec of nft that grows with the
// number of sandboxes: loaded once per change, under the manager's lock, a
// burst of 100 creates waited 5–6 s for the network alone (measured on the
// 2-core CI host). Attach and Detach now change the state under the lock,
// release it and wait in sync for a load planned after their change; one
// load covers every change made while the one before it ran.
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

// changedLocked marks a change of the state the ruleset renders and
// returns its generation, for sync.
func (m *Manager) changedLocked() uint64 {
	m.gen++
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

// loadOnce renders the current state and loads it: the generation it
// rendered, and the load's outcome. Not bound to one caller's ctx: the load
// is every waiter's.
func (m *Manager) loadOnce(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.mu.Lock()
	g := m.gen
	script, err := m.planLocked()
	m.nftMu.Lock()
	m.mu.Unlock()
	defer m.nftMu.Unlock()
	if err != nil {
		return g, err
	}
	return g, nftApply(ctx, script)
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
