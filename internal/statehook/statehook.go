// Package statehook is the one place the lifecycle tells the state services
// (task ledger, handoff notes, side effects, credential leases, audit) that a
// sandbox was paused, resumed, forked or restored, so each can apply its row
// of the state table (docs/STATE.md) without the lifecycle knowing them.
//
// A hook runs synchronously with the lifecycle step, under the sandbox's
// lock (BeforePause on a goroutine of its own beside the pause's intent
// commit, which the step waits for before it freezes): it must be quick, must not take another sandbox's lock,
// and must not call back into the lifecycle verbs. A hook's error never fails
// the lifecycle step it observes (the step already happened, or must happen
// regardless); the bus logs it and hands it to OnError, which the daemon
// turns into an honest `state_degraded` event on the sandbox.
package statehook

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// Phase is the lifecycle moment a hook observes.
type Phase string

const (
	// BeforePause: the sandbox is still running and its agent reachable;
	// the pause has been validated and its intent is being committed.
	BeforePause Phase = "before_pause"
	// Paused: the pause completed (Sandbox.PauseActual says how).
	Paused Phase = "paused"
	// Resumed: a paused sandbox runs again (thawed, restored or cold-booted).
	Resumed Phase = "resumed"
	// Forked: Sandbox is a new child of From, booted from the fork point.
	Forked Phase = "forked"
	// Restored: Sandbox now holds an older state — a rewind in place
	// (Sandbox.ID == From, Checkpoint set) or a new sandbox created from a
	// snapshot of From (Snapshot set). PointAt is when that state was taken.
	Restored Phase = "restored"
	// BeforeStop: a running sandbox is about to be stopped.
	BeforeStop Phase = "before_stop"
)

// Event is what a hook is told.
type Event struct {
	Phase   Phase
	Sandbox *sandbox.Sandbox // the sandbox as stored after the step (before it, for Before*)
	Actor   string
	// From is the fork parent (Forked), or the sandbox whose older state was
	// restored (Restored); empty otherwise.
	From string
	// Checkpoint / Snapshot name the restored point (Restored); PointAt is
	// when it was taken. ForkPoint is the fork's point in time (Forked).
	Checkpoint string
	Snapshot   string
	PointAt    time.Time
	At         time.Time
	// LeasesReissued: the step's own commit already revoked the sandbox's
	// leases and issued the next generation, or its plan found nothing to
	// reissue (a resume, internal/leases Reissue): the lease hook skips it.
	LeasesReissued bool
}

// Hook is one state service's reaction to lifecycle moments. It ignores
// phases it does not care about.
type Hook interface {
	OnState(ctx context.Context, ev Event) error
}

// Func adapts a function to Hook.
type Func func(ctx context.Context, ev Event) error

// OnState calls f.
func (f Func) OnState(ctx context.Context, ev Event) error { return f(ctx, ev) }

// Bus calls every registered hook in registration order. The zero value
// and a nil *Bus are usable (no hooks).
type Bus struct {
	mu    sync.RWMutex
	hooks []named
	// OnError is told of a hook's failure (after it is logged). Optional.
	OnError func(ctx context.Context, ev Event, hook string, err error)
	Log     *slog.Logger
}

type named struct {
	name string
	h    Hook
}

// Register adds a hook under a name used in logs and degraded events.
func (b *Bus) Register(name string, h Hook) {
	b.mu.Lock()
	b.hooks = append(b.hooks, named{name, h})
	b.mu.Unlock()
}

// Fire runs every hook for ev and returns their errors joined (for tests:
// callers in the lifecycle ignore it, OnError has reported each one).
func (b *Bus) Fire(ctx context.Context, ev Event) error {
	if b == nil {
		return nil
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	b.mu.RLock()
	hooks := append([]named(nil), b.hooks...)
	b.mu.RUnlock()
	var all []error
	for _, n := range hooks {
		if err := n.h.OnState(ctx, ev); err != nil {
			all = append(all, err)
			b.Report(ctx, ev, n.name, err)
		}
	}
	return errors.Join(all...)
}

// Report logs and reports a failure of hook's part of ev that the
// lifecycle did itself (a part folded into the step's commit), as Fire
// does a hook's error.
func (b *Bus) Report(ctx context.Context, ev Event, hook string, err error) {
	if b == nil {
		return
	}
	id := ""
	if ev.Sandbox != nil {
		id = ev.Sandbox.ID
	}
	if b.Log != nil {
		b.Log.WarnContext(ctx, "state hook failed", "hook", hook, "phase", ev.Phase, "sandbox_id", id, "err", err)
	}
	if b.OnError != nil {
		b.OnError(ctx, ev, hook, err)
	}
}
