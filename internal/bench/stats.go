// Package bench measures every number berth publishes, each next to a
// baseline measured in the same run on the same machine: the raw OCI runtime,
// a host fork+exec, a host write+fsync. The statistics and the report are
// pure; the measurements drive a real berth server through its REST API.
package bench

import (
	"math"
	"slices"
)

// Summary is the distribution of one metric's samples.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of samples by linear
// interpolation between closest ranks (Hyndman & Fan type 7, numpy's and
// Excel PERCENTILE.INC's default): sort ascending, h = (n-1)·p/100, and
// interpolate between x[⌊h⌋] and x[⌊h⌋+1]. With one sample every percentile
// is that sample; with none it is NaN. samples is not modified.
func Percentile(samples []float64, p float64) float64 {
	if len(samples) == 0 || math.IsNaN(p) {
		return math.NaN()
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	p = math.Min(100, math.Max(0, p))
	h := float64(len(s)-1) * p / 100
	lo := int(math.Floor(h))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

// Summarize computes the summary of samples; nil for no samples.
func Summarize(samples []float64) *Summary {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return &Summary{
		N: len(s), P50: percentileSorted(s, 50), P95: percentileSorted(s, 95), P99: percentileSorted(s, 99),
		Min: s[0], Max: s[len(s)-1], Mean: sum / float64(len(s)),
	}
}

// Ratio is berth's p50 over the baseline's p50: how many times the
// baseline berth costs (2.0 = twice as slow). ok is false when either side
// has no samples or the baseline's p50 is not positive.
func Ratio(berth, baseline *Summary) (ratio float64, ok bool) {
	if berth == nil || baseline == nil || baseline.P50 <= 0 {
		return 0, false
	}
	return berth.P50 / baseline.P50, true
}
