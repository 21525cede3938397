package testutil

import (
	"errors"
	"testing"
	"time"
)

// DefaultPoll is how often Eventually checks its condition unless told.
const DefaultPoll = 100 * time.Millisecond

// Wait is one condition to wait for: Timeout bounds it, Poll is the pause
// between checks (DefaultPoll if zero).
type Wait struct {
	Timeout time.Duration
	Poll    time.Duration
}

// Within waits up to timeout, checking every DefaultPoll.
func Within(timeout time.Duration) Wait { return Wait{Timeout: timeout} }

// Every sets the pause between checks.
func (w Wait) Every(poll time.Duration) Wait {
	w.Poll = poll
	return w
}

// errNotYet is the failure of a condition that said only "not yet".
var errNotYet = errors.New("condition not met")

// Until checks cond (at once, then after every pause) until it returns
// nil or the timeout has passed, and returns nil or cond's last error. The
// last check runs at or after the deadline, so a condition that turns true
// just in time is seen.
func (w Wait) Until(cond func() error) error {
	poll := w.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	deadline := time.Now().Add(w.Timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(min(poll, max(time.Until(deadline), time.Millisecond)))
	}
}

// Eventually fails t unless cond returns nil within w's timeout, reporting
// cond's last error: the one helper berth's tests wait for a condition with.
//
//	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
//		if n := count(); n < 3 {
//			return fmt.Errorf("count is %d, want 3", n)
//		}
//		return nil
//	})
func Eventually(t testing.TB, w Wait, cond func() error) {
	t.Helper()
	if err := w.Until(cond); err != nil {
		t.Fatalf("timed out after %s: %v", w.Timeout, err)
	}
}

// True adapts a boolean condition: not yet is reported as msg() (or a
// generic message if msg is nil), computed only when it is needed.
func True(ok func() bool, msg func() string) func() error {
	return func() error {
		if ok() {
			return nil
		}
		if msg == nil {
			return errNotYet
		}
		return errors.New(msg())
	}
}
