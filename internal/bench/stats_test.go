package bench

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []float64
		p, want float64
	}{
		{"one sample is every percentile", []float64{7}, 99, 7},
		{"p0 is the min", []float64{3, 1, 2}, 0, 1},
		{"p100 is the max", []float64{3, 1, 2}, 100, 3},
		{"median of odd n is the middle", []float64{5, 1, 3}, 50, 3},
		{"median of even n interpolates", []float64{1, 2, 3, 4}, 50, 2.5},
		// h = (5-1)*0.95 = 3.8: x[3] + 0.8*(x[4]-x[3]) = 40 + 0.8*10.
		{"p95 interpolates between closest ranks", []float64{10, 20, 30, 40, 50}, 95, 48},
		// h = (10-1)*0.99 = 8.91: 9 + 0.91*1.
		{"p99 of 1..10", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 9.91},
		{"p clamps above 100", []float64{1, 2}, 150, 2},
		{"p clamps below 0", []float64{1, 2}, -5, 1},
		{"unsorted input", []float64{9, 1, 5, 3, 7}, 25, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.samples, tc.p); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.samples, tc.p, got, tc.want)
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(nil) = %v, want NaN", got)
	}
	in := []float64{3, 1, 2}
	Percentile(in, 50)
	if diff := cmp.Diff([]float64{3, 1, 2}, in); diff != "" {
		t.Errorf("Percentile modified its input (-want +got):\n%s", diff)
	}
}

func TestSummarize(t *testing.T) {
	if Summarize(nil) != nil {
		t.Error("Summarize(nil) should be nil")
	}
	got := Summarize([]float64{4, 1, 3, 2})
	want := &Summary{N: 4, P50: 2.5, P95: 3.85, P99: 3.97, Min: 1, Max: 4, Mean: 2.5}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		name        string
		berth, base *Summary
		want        float64
		ok          bool
	}{
		{"twice as slow", &Summary{P50: 20}, &Summary{P50: 10}, 2, true},
		{"faster than baseline", &Summary{P50: 5}, &Summary{P50: 10}, 0.5, true},
		{"no baseline", &Summary{P50: 5}, nil, 0, false},
		{"no samples", nil, &Summary{P50: 10}, 0, false},
		{"zero baseline", &Summary{P50: 5}, &Summary{P50: 0}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Ratio(tc.berth, tc.base)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Ratio = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestBurstSize(t *testing.T) {
	for runs, want := range map[int]int{1: 4, 3: 12, 5: 20, 24: 96, 25: 100, 1000: 100} {
		if got := BurstSize(runs); got != want {
			t.Errorf("BurstSize(%d) = %d, want %d", runs, got, want)
		}
	}
}
