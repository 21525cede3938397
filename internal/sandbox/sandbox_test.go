package sandbox

import (
	"errors"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestTransitionTable(t *testing.T) {
	legal := map[[2]State]bool{}
	for from, tos := range transitions {
		for _, to := range tos {
			legal[[2]State{from, to}] = true
		}
	}
	for _, from := range States() {
		for _, to := range States() {
			err := Transition(from, to)
			if legal[[2]State{from, to}] {
				if err != nil {
					t.Errorf("%s → %s: %v, want legal", from, to, err)
				}
				continue
			}
			var te *TransitionError
			if !errors.As(err, &te) || te.From != from || te.To != to {
				t.Errorf("%s → %s: %v, want *TransitionError", from, to, err)
			}
			if errs.KindOf(err) != errs.Conflict {
				t.Errorf("%s → %s: kind %v, want Conflict (HTTP 409)", from, to, errs.KindOf(err))
			}
		}
	}
	// Spot checks of the lifecycle the product promises.
	for _, c := range []struct {
		from, to State
		ok       bool
	}{
		{Creating, Running, true}, {Running, Pausing, true}, {Pausing, Paused, true}, {Paused, Resuming, true},
		{Resuming, Running, true}, {Running, Stopped, true}, {Stopped, Running, true}, {Failed, Deleted, true},
		{Paused, Pausing, false}, {Stopped, Paused, false}, {Deleted, Running, false}, {Creating, Paused, false},
	} {
		if got := CanTransition(c.from, c.to); got != c.ok {
			t.Errorf("CanTransition(%s, %s) = %v, want %v", c.from, c.to, got, c.ok)
		}
	}
	for _, s := range States() {
		if _, ok := transitions[s]; !ok {
			t.Errorf("state %s missing from the transition table", s)
		}
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewID()
		if !ValidID(id) || len(id) != 20 || id[0] < 'a' || id[0] > 'z' {
			t.Fatalf("NewID() = %q: want 20 chars of [a-z0-9] starting with a letter", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "Abc", "a-b", "a_b", "../x", "a b"} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestValidateLabels(t *testing.T) {
	long := make([]byte, 129)
	for i := range long {
		long[i] = 'k'
	}
	for _, c := range []struct {
		labels map[string]string
		ok     bool
	}{
		{map[string]string{"team": "a", "app.kubernetes.io/name": "x"}, true},
		{map[string]string{"user id": "a&b=c"}, true}, // E2B metadata
		{map[string]string{"": "x"}, false},
		{map[string]string{"a=b": "x"}, false},
		{map[string]string{"k": "line\nbreak"}, false},
		{map[string]string{string(long): "x"}, false},
		{map[string]string{"k": string([]byte{0xff})}, false},
	} {
		err := ValidateLabels("labels", c.labels)
		if (err == nil) != c.ok {
			t.Errorf("ValidateLabels(%q) = %v, want ok=%v", c.labels, err, c.ok)
		}
		if err != nil && errs.FieldOf(err) != "labels" {
			t.Errorf("ValidateLabels(%q) names field %q, want labels", c.labels, errs.FieldOf(err))
		}
	}
}

func TestValidateResources(t *testing.T) {
	max := Resources{CPUMillis: 4000, MemoryMiB: 8192, DiskMiB: 10240, Pids: 4096}
	for _, c := range []struct {
		r     Resources
		field string
	}{
		{Resources{}, ""},
		{Resources{CPUMillis: 500, MemoryMiB: 64, DiskMiB: 64, Pids: 64}, ""},
		{Resources{CPUMillis: 5}, "cpu"},
		{Resources{CPUMillis: 5000}, "cpu"},
		{Resources{MemoryMiB: 8}, "memory"},
		{Resources{MemoryMiB: 9000}, "memory"},
		{Resources{DiskMiB: -1}, "disk"},
		{Resources{Pids: 2}, "pids"},
	} {
		err := ValidateResources(c.r, max)
		if got := errs.FieldOf(err); got != c.field {
			t.Errorf("ValidateResources(%+v) = %v (field %q), want field %q", c.r, err, got, c.field)
		}
	}
}

func TestEnumValidation(t *testing.T) {
	for _, a := range []ExpiryAction{ExpireStop, ExpireDelete, ExpirePause} {
		if err := ValidExpiryAction(a); err != nil {
			t.Error(err)
		}
	}
	if errs.FieldOf(ValidExpiryAction("explode")) != "expiry_action" {
		t.Error("bad expiry action does not name the field")
	}
	for _, m := range []PauseMode{PauseFreeze, PauseMemory, PauseDisk} {
		if err := ValidPauseMode(m); err != nil {
			t.Error(err)
		}
	}
	if errs.FieldOf(ValidPauseMode("nap")) != "mode" {
		t.Error("bad pause mode does not name the field")
	}
}
