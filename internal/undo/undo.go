// Package undo is the cleanup stack of an operation made of steps with
// side effects (create a sandbox, attach its network, prepare its
// filesystem): each step pushes its undo right after it succeeds; on
// failure the undos run in reverse order and their errors are joined to
// the one that caused the failure; on success the stack is released.
//
// A Stack owns no lock: it belongs to the one goroutine running the
// operation.
package undo

import (
	"context"
	"errors"
	"time"
)

// Stack holds the undo steps of an operation in progress. The zero value
// is an empty stack.
type Stack struct {
	steps []func(context.Context) error
}

// Push registers the undo of a step that has just succeeded.
func (s *Stack) Push(step func(ctx context.Context) error) {
	s.steps = append(s.steps, step)
}

// Len is the number of undo steps registered and not yet run or released.
func (s *Stack) Len() int { return len(s.steps) }

// Release forgets every step: the operation succeeded and keeps its effects.
func (s *Stack) Release() { s.steps = nil }

// Run runs every step, the last pushed first, and returns their errors
// joined (nil if all succeeded). A failing step does not stop the others.
// The stack is empty afterwards, so a second Run does nothing.
func (s *Stack) Run(ctx context.Context) error {
	steps := s.steps
	s.steps = nil
	var errList []error
	for i := len(steps) - 1; i >= 0; i-- {
		errList = append(errList, steps[i](ctx))
	}
	return errors.Join(errList...)
}

// Unwind is meant to be deferred with the operation's named error result:
// if *errp is nil it releases the stack; otherwise it runs the steps under
// a context that ctx's cancellation does not reach (a cancelled request
// must not stop its own clean-up), bounded by timeout, and joins their
// errors to *errp.
func (s *Stack) Unwind(ctx context.Context, timeout time.Duration, errp *error) {
	if *errp == nil {
		s.Release()
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if uerr := s.Run(tctx); uerr != nil {
		*errp = errors.Join(*errp, uerr)
	}
}
