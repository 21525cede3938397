// Package sandbox holds the sandbox model and its state machine. It does no I/O.
package sandbox

import (
	"fmt"

	"github.com/berth-dev/berth/internal/errs"
)

// State is a sandbox lifecycle state.
type State string

const (
	Creating State = "creating"
	Running  State = "running"
	Pausing  State = "pausing"
	Paused   State = "paused"
	Resuming State = "resuming"
	Stopped  State = "stopped"
	Failed   State = "failed"
	Deleted  State = "deleted"
	// Lost is cluster mode's: the node running the sandbox stopped renewing
	// its Lease. A lost sandbox is never resurrected (its node stops it when
	// it returns); it can only be deleted.
	Lost State = "lost"
)

// States lists every state, in lifecycle order.
func States() []State {
	return []State{Creating, Running, Pausing, Paused, Resuming, Stopped, Failed, Deleted}
}

// ValidState reports whether s names a state.
func ValidState(s string) bool {
	for _, st := range States() {
		if string(st) == s {
			return true
		}
	}
	return false
}

// transitions is the one table of legal moves. Pausing/Resuming are the
// intent states written before the side effect, so a daemon crash mid-way is
// resolved by reconciliation rather than guessed.
var transitions = map[State][]State{
	Creating: {Running, Failed, Deleted, Lost},
	Running:  {Pausing, Paused, Stopped, Failed, Deleted, Lost},
	Pausing:  {Paused, Running, Failed, Deleted, Lost},
	Paused:   {Resuming, Running, Stopped, Failed, Deleted, Lost},
	Resuming: {Running, Paused, Failed, Deleted, Lost},
	Stopped:  {Creating, Running, Failed, Deleted, Lost},
	Failed:   {Running, Stopped, Deleted, Lost},
	Lost:     {Deleted},
	Deleted:  {},
}

// TransitionError is returned for an illegal move. It wraps a
// FailedPrecondition-kind error so protocols map it to 409.
type TransitionError struct {
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("sandbox is %s; cannot move to %s", e.From, e.To)
}

func (e *TransitionError) Unwrap() error {
	return &errs.Error{Kind: errs.Conflict, Message: e.Error()}
}

// CanTransition reports whether from → to is legal.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Transition returns nil if from → to is legal, else a *TransitionError.
func Transition(from, to State) error {
	if CanTransition(from, to) {
		return nil
	}
	return &TransitionError{From: from, To: to}
}

// Live reports whether a sandbox in state s has processes (or a frozen image of them) on the host.
func (s State) Live() bool {
	return s == Running || s == Pausing || s == Resuming
}
