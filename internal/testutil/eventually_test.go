package testutil

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	err := Within(time.Second).Every(time.Millisecond).Until(func() error {
		n++
		if n < 3 {
			return fmt.Errorf("n is %d", n)
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("Until = %v after %d checks, want nil after 3", err, n)
	}
	n = 0
	start := time.Now()
	err = Within(30 * time.Millisecond).Every(5 * time.Millisecond).Until(func() error {
		n++
		return fmt.Errorf("check %d failed", n)
	})
	if err == nil || err.Error() != fmt.Sprintf("check %d failed", n) || n < 2 {
		t.Fatalf("Until = %v after %d checks; want the last check's error", err, n)
	}
	if el := time.Since(start); el < 30*time.Millisecond || el > 2*time.Second {
		t.Errorf("Until gave up after %v, want about 30ms", el)
	}
	// A zero timeout checks once.
	n = 0
	if err := Within(0).Until(func() error { n++; return errors.New("no") }); err == nil || n != 1 {
		t.Errorf("Within(0): %v after %d checks, want one failed check", err, n)
	}
}

// recorder is a testing.TB whose Fatalf records and ends the goroutine.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventuallyReportsLastFailure(t *testing.T) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		i := 0
		Eventually(r, Within(20*time.Millisecond).Every(time.Millisecond), True(func() bool { i++; return false },
			func() string { return fmt.Sprintf("state %d", i) }))
	}()
	<-done
	if !strings.HasPrefix(r.msg, "timed out after 20ms: state ") || strings.HasSuffix(r.msg, "state 1") {
		t.Fatalf("Eventually reported %q, want the last of several failures", r.msg)
	}
	r.msg = ""
	Eventually(r, Within(time.Second), True(func() bool { return true }, nil))
	if r.msg != "" {
		t.Fatalf("Eventually failed a true condition: %s", r.msg)
	}
	if err := True(func() bool { return false }, nil)(); err == nil {
		t.Fatal("True with no message reported success")
	}
}
