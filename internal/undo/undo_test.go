package undo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRunReverseJoinsErrors(t *testing.T) {
	var order []int
	e2, e0 := errors.New("two"), errors.New("zero")
	var s Stack
	for i, err := range []error{e0, nil, e2} {
		s.Push(func(context.Context) error { order = append(order, i); return err })
	}
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want 3", s.Len())
	}
	err := s.Run(context.Background())
	if diff := cmp.Diff([]int{2, 1, 0}, order); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if !errors.Is(err, e0) || !errors.Is(err, e2) {
		t.Errorf("Run = %v, want both step errors", err)
	}
	if err := s.Run(context.Background()); err != nil || len(order) != 3 || s.Len() != 0 {
		t.Errorf("second Run = %v, ran %d steps in all; want nothing run again", err, len(order))
	}
}

func TestUnwind(t *testing.T) {
	cause := errors.New("step 3 failed")
	undoErr := errors.New("undo failed")
	for _, tc := range []struct {
		name     string
		err      error
		stepErr  error
		wantRun  bool
		wantErrs []error
	}{
		{name: "success releases", err: nil, wantRun: false},
		{name: "failure runs the steps", err: cause, wantRun: true, wantErrs: []error{cause}},
		{name: "undo errors are joined", err: cause, stepErr: undoErr, wantRun: true, wantErrs: []error{cause, undoErr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the request is gone: its clean-up still runs
			ran := false
			var stepCtxErr error
			var hasDeadline bool
			op := func() (err error) {
				var s Stack
				defer s.Unwind(ctx, time.Minute, &err)
				s.Push(func(c context.Context) error {
					ran, stepCtxErr = true, c.Err()
					_, hasDeadline = c.Deadline()
					return tc.stepErr
				})
				return tc.err
			}
			err := op()
			if ran != tc.wantRun {
				t.Fatalf("undo ran = %v, want %v", ran, tc.wantRun)
			}
			if !tc.wantRun {
				if err != nil {
					t.Errorf("err = %v, want nil", err)
				}
				return
			}
			if stepCtxErr != nil || !hasDeadline {
				t.Errorf("undo step ctx: err %v, deadline %v; want live with a deadline", stepCtxErr, hasDeadline)
			}
			for _, w := range tc.wantErrs {
				if !errors.Is(err, w) {
					t.Errorf("err = %v, want it to wrap %v", err, w)
				}
			}
		})
	}
}

func TestReleaseForgets(t *testing.T) {
	var s Stack
	s.Push(func(context.Context) error { t.Error("released step ran"); return nil })
	s.Release()
	if err := s.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
