package lazyregexp

import (
	"sync"
	"testing"
)

func TestMatchesLikeRegexp(t *testing.T) {
	re := New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	for s, want := range map[string]bool{"a": true, "tiny-1.0": true, "": false, "-a": false, "A": false, string(make([]byte, 64)): false} {
		if got := re.MatchString(s); got != want {
			t.Errorf("MatchString(%q) = %v, want %v", s, got, want)
		}
	}
	if m := New(`"id":\s*"([a-z0-9]+)"`).FindSubmatch([]byte(`{"id": "abc1"}`)); len(m) != 2 || string(m[1]) != "abc1" {
		t.Errorf("FindSubmatch = %q", m)
	}
}

// String must not compile: error messages quote the pattern, and a
// pattern that is never used must cost nothing.
func TestStringDoesNotCompile(t *testing.T) {
	re := New(`(`) // invalid: compiling it would panic
	if re.String() != `(` {
		t.Fatalf("String() = %q", re.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an invalid pattern did not panic at its first use")
		}
	}()
	re.MatchString("x")
}

// Concurrent first uses compile once and all see the same program (run with -race).
func TestConcurrentFirstUse(t *testing.T) {
	re := New(`^[a-z]{1,64}$`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !re.MatchString("abc") {
				t.Error("no match")
			}
		}()
	}
	wg.Wait()
	if re.Regexp() != re.Regexp() {
		t.Fatal("compiled twice")
	}
}
