package placement

import (
	"math"
	"time"
)

// PoolInput is what a node knows when it sizes its warm pool for one template.
type PoolInput struct {
	Rate    float64       // claims per second for the template at this node (Rate.At)
	Refill  time.Duration // time to start a new member
	HitRate float64       // wanted share of claims a ready member serves, in (0, 1)
	// MaxIdle: no pool when claims come less often than once per MaxIdle on
	// average (a member would sit idle longer than that, paying memory for
	// one claim).
	MaxIdle time.Duration
	Max     int // the most members a node keeps for one template (0: no cap)
}

// PoolSize is the smallest pool that serves HitRate of the claims. A claim
// takes a ready member and starts a refill of length Refill; a claim that
// finds the pool empty is a cold start and starts no refill (it starts its
// own sandbox). With Poisson claims the members being refilled are the
// busy servers of an Erlang loss system (M/G/S/S, insensitive to the
// refill time's distribution), so a claim misses with probability
// ErlangB(S, Rate×Refill); PoolSize returns the least S for which that is
// at most 1−HitRate.
func PoolSize(in PoolInput) int {
	if in.Rate <= 0 || in.HitRate <= 0 || math.IsNaN(in.Rate) {
		return 0
	}
	if in.MaxIdle > 0 && 1/in.Rate > in.MaxIdle.Seconds() {
		return 0
	}
	a := in.Rate * in.Refill.Seconds()
	miss := 1 - min(in.HitRate, 0.999999)
	limit := in.Max
	if limit <= 0 {
		limit = 1 << 16
	}
	for s := 1; s <= limit; s++ {
		if ErlangB(s, a) <= miss {
			return s
		}
	}
	return limit
}

// ErlangB is the probability that an arrival finds all s servers busy in an
// Erlang loss system offered a erlangs.
func ErlangB(s int, a float64) float64 {
	b := 1.0
	for k := 1; k <= s; k++ {
		b = a * b / (float64(k) + a*b)
	}
	return b
}

// Rate estimates an arrival rate: an exponentially decaying count of
// arrivals with time constant Tau, divided by Tau. Pure value type; the
// zero value with a Tau is ready.
type Rate struct {
	Tau   time.Duration
	count float64
	last  time.Time
}

// Observe records one arrival at t (times must not go backwards).
func (r *Rate) Observe(t time.Time) {
	r.count = r.decayed(t) + 1
	r.last = t
}

// At returns the estimated arrivals per second at t.
func (r *Rate) At(t time.Time) float64 {
	if r.Tau <= 0 {
		return 0
	}
	return r.decayed(t) / r.Tau.Seconds()
}

func (r *Rate) decayed(t time.Time) float64 {
	if r.last.IsZero() || r.Tau <= 0 {
		return r.count
	}
	dt := t.Sub(r.last)
	if dt <= 0 {
		return r.count
	}
	return r.count * math.Exp(-dt.Seconds()/r.Tau.Seconds())
}
