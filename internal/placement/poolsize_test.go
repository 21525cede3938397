package placement

import (
	"math"
	"testing"
	"time"
)

func TestErlangB(t *testing.T) {
	for _, tc := range []struct {
		s    int
		a    float64
		want float64
	}{
		{0, 1, 1},
		{1, 1, 0.5},
		{2, 1, 0.2},
		{3, 1, 1.0 / 16},
		{1, 0.1, 0.1 / 1.1},
		{10, 5, 0.018385},
	} {
		if got := ErlangB(tc.s, tc.a); math.Abs(got-tc.want) > 1e-5 {
			t.Errorf("ErlangB(%d, %g) = %g; want %g", tc.s, tc.a, got, tc.want)
		}
	}
}

func TestPoolSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   PoolInput
		want int
	}{
		{"no claims, no pool", PoolInput{Rate: 0, Refill: 2 * time.Second, HitRate: 0.9}, 0},
		{"1 erlang at 90%: B(3,1) = 6.25%", PoolInput{Rate: 0.5, Refill: 2 * time.Second, HitRate: 0.9}, 3},
		{"1 erlang at 95%: B(3,1) > 5%, B(4,1) = 1.5%", PoolInput{Rate: 0.5, Refill: 2 * time.Second, HitRate: 0.95}, 4},
		{"a slow trickle still gets one member", PoolInput{Rate: 1.0 / 300, Refill: 2 * time.Second, HitRate: 0.9, MaxIdle: 10 * time.Minute}, 1},
		{"rarer than MaxIdle: none", PoolInput{Rate: 1.0 / 1200, Refill: 2 * time.Second, HitRate: 0.9, MaxIdle: 10 * time.Minute}, 0},
		{"slow refills need more members", PoolInput{Rate: 0.5, Refill: 20 * time.Second, HitRate: 0.9}, 13},
		{"capped", PoolInput{Rate: 5, Refill: 20 * time.Second, HitRate: 0.99, Max: 8}, 8},
		{"NaN rate", PoolInput{Rate: math.NaN(), Refill: time.Second, HitRate: 0.9}, 0},
	} {
		if got := PoolSize(tc.in); got != tc.want {
			t.Errorf("%s: PoolSize(%+v) = %d; want %d", tc.name, tc.in, got, tc.want)
		}
	}
	// The size meets the target and one less does not.
	in := PoolInput{Rate: 0.5, Refill: 20 * time.Second, HitRate: 0.9}
	s := PoolSize(in)
	if ErlangB(s, 10) > 0.1 || ErlangB(s-1, 10) <= 0.1 {
		t.Errorf("size %d is not the least meeting 90%%", s)
	}
}

func TestRate(t *testing.T) {
	r := Rate{Tau: 10 * time.Minute}
	if r.At(t0) != 0 {
		t.Fatal("no arrivals, no rate")
	}
	for i := range 3600 {
		r.Observe(t0.Add(time.Duration(i) * time.Second))
	}
	end := t0.Add(time.Hour)
	if got := r.At(end); math.Abs(got-1) > 0.01 {
		t.Errorf("1/s for an hour: %g", got)
	}
	// It decays with no arrivals: one time constant later, to 1/e.
	if got := r.At(end.Add(10 * time.Minute)); math.Abs(got-1/math.E) > 0.01 {
		t.Errorf("a τ later: %g", got)
	}
}
