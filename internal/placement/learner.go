package placement

import (
	"math"
	"time"
)

// Learner estimates a template's task duration from the durations it has
// seen: an exponentially weighted mean and variance of log(duration) per
// template fingerprint, started from a prior worth PriorWeight
// observations. Log space because durations are heavy-tailed (a median of
// 30 s and a tail of hours); a running mean until 1/Alpha samples, then an
// EWMA, so a template whose use changes is followed. Deterministic, no
// I/O; not safe for concurrent use (the scheduler owns one).
type Learner struct {
	Prior       time.Duration // median assumed for a template never seen
	PriorSigma  float64       // spread of log(duration) assumed for it
	PriorWeight float64       // how many observations the prior is worth
	Alpha       float64       // weight of a new observation once warmed up
	stats       map[string]*logStat
}

type logStat struct {
	n              int
	w              float64 // observations so far, the prior's included
	mean, variance float64
}

// NewLearner returns a learner with berth's prior: 10 minutes, σ = 1.5
// (a factor of 4.5 either way), worth 2 observations, α = 0.05.
func NewLearner() *Learner {
	return &Learner{Prior: 10 * time.Minute, PriorSigma: 1.5, PriorWeight: 2, Alpha: 0.05}
}

// Estimate is what the learner expects of a template.
type Estimate struct {
	Median  time.Duration `json:"median"`
	P90     time.Duration `json:"p90"`
	Samples int           `json:"samples"`
}

// Observe records that a sandbox of template fp ran for d.
func (l *Learner) Observe(fp string, d time.Duration) {
	if d <= 0 {
		d = time.Millisecond
	}
	if l.stats == nil {
		l.stats = map[string]*logStat{}
	}
	s := l.stats[fp]
	if s == nil {
		s = &logStat{w: l.PriorWeight, mean: math.Log(l.Prior.Seconds()), variance: l.PriorSigma * l.PriorSigma}
		l.stats[fp] = s
	}
	x := math.Log(d.Seconds())
	s.w++
	s.n++
	a := max(1/s.w, l.Alpha)
	diff := x - s.mean
	s.mean += a * diff
	s.variance = (1 - a) * (s.variance + a*diff*diff)
}

// Estimate returns what the learner expects of fp (the prior when unseen).
func (l *Learner) Estimate(fp string) Estimate {
	mean, sd, n := math.Log(l.Prior.Seconds()), l.PriorSigma, 0
	if s := l.stats[fp]; s != nil {
		mean, sd, n = s.mean, math.Sqrt(s.variance), s.n
	}
	return Estimate{Median: seconds(math.Exp(mean)), P90: seconds(math.Exp(mean + 1.2816*sd)), Samples: n}
}

// Fill gives a request without an expected duration or class the learned
// median of its template; a request that says either is left as it is.
func (l *Learner) Fill(req Request) Request {
	if req.Expected == 0 && req.Class == "" {
		req.Expected = l.Estimate(req.Fingerprint).Median
	}
	return req
}

func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}
