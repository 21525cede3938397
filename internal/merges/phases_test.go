package merges

import (
	"testing"
	"time"
)

func TestClockAccumulatesPhases(t *testing.T) {
	start := time.Now().Add(-30 * time.Millisecond)
	c := newClock(start)
	c.mark("capture") // ~30 ms
	c.last = c.last.Add(-5 * time.Millisecond)
	c.mark("plan") // ~5 ms
	c.last = c.last.Add(-7 * time.Millisecond)
	c.mark("plan") // a re-plan adds up: ~12 ms
	p := c.phases()
	if p["capture"] < 30 || p["capture"] > 1000 {
		t.Errorf("capture = %v ms, want ≥ 30", p["capture"])
	}
	if p["plan"] < 12 || p["plan"] > 1000 {
		t.Errorf("plan = %v ms, want ≥ 12 (two marks summed)", p["plan"])
	}
	if v := p["plan"] * 10; v != float64(int64(v)) {
		t.Errorf("plan = %v, want 0.1 ms resolution", p["plan"])
	}
	p["capture"] = -1
	if c.phases()["capture"] < 0 {
		t.Error("phases() shares its map with the clock")
	}
	d := Phases{"stage": 1.25, "commit": 3}.eventData(map[string]string{"merge": "m"})
	for k, want := range map[string]string{"merge": "m", "stage_ms": "1.2", "commit_ms": "3.0"} {
		if d[k] != want && !(k == "stage_ms" && d[k] == "1.3") {
			t.Errorf("event data %s = %q, want %q", k, d[k], want)
		}
	}
	var nilClock *clock
	nilClock.mark("x") // a nil clock measures nothing and does not panic
	if nilClock.phases() != nil {
		t.Error("nil clock has phases")
	}
}
