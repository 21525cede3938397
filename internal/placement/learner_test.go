package placement

import (
	"testing"
	"time"
)

func near(got, want time.Duration, frac float64) bool {
	d := float64(got - want)
	return d <= frac*float64(want) && -d <= frac*float64(want)
}

func TestLearner(t *testing.T) {
	l := NewLearner()
	if e := l.Estimate("new"); e.Median != 10*time.Minute || e.Samples != 0 || e.P90 <= e.Median {
		t.Errorf("unseen template: %+v; want the prior (10m)", e)
	}
	for range 200 {
		l.Observe("lint", 30*time.Second)
	}
	if e := l.Estimate("lint"); !near(e.Median, 30*time.Second, 0.01) || e.Samples != 200 {
		t.Errorf("after 200 × 30s: %+v", e)
	}
	// A template whose use changes is followed (EWMA), not averaged forever.
	for range 100 {
		l.Observe("lint", 2*time.Hour)
	}
	if e := l.Estimate("lint"); !near(e.Median, 2*time.Hour, 0.05) {
		t.Errorf("after the switch to 2h: %+v", e)
	}
	// A bimodal template: the median sits between, the P90 towards the long mode.
	for i := range 400 {
		d := 20 * time.Second
		if i%4 == 0 {
			d = time.Hour
		}
		l.Observe("mixed", d)
	}
	e := l.Estimate("mixed")
	if e.Median < 20*time.Second || e.Median > 10*time.Minute || e.P90 < 10*time.Minute {
		t.Errorf("bimodal: %+v", e)
	}
	// One observation moves the prior by its weight (1/3 of the way in log space).
	l2 := NewLearner()
	l2.Observe("x", 10*time.Minute*27)
	if got := l2.Estimate("x").Median; !near(got, 30*time.Minute, 0.01) {
		t.Errorf("one observation: %s; want 30m", got)
	}
}

func TestLearnerFill(t *testing.T) {
	l := NewLearner()
	for range 50 {
		l.Observe("fp", 40*time.Second)
	}
	for _, tc := range []struct {
		in   Request
		want time.Duration
	}{
		{Request{Fingerprint: "fp"}, 40 * time.Second},
		{Request{Fingerprint: "fp", Class: Long}, 0},                 // the user's class stands
		{Request{Fingerprint: "fp", Expected: time.Hour}, time.Hour}, // the user's duration stands
		{Request{Fingerprint: "unseen"}, 10 * time.Minute},           // the prior
	} {
		if got := l.Fill(tc.in).Expected; !near(got, tc.want, 0.1) && got != tc.want {
			t.Errorf("Fill(%+v).Expected = %s; want %s", tc.in, got, tc.want)
		}
	}
}
