package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The scale row takes minutes: never part of the default set, measured
// only when --only names it.
func TestScaleIsOptIn(t *testing.T) {
	all := &Runner{o: Options{}}
	if all.want("scale") {
		t.Errorf("the default set includes scale")
	}
	if !all.want("create-cold") {
		t.Errorf("the default set lost create-cold")
	}
	if only := (&Runner{o: Options{Only: []string{"scale"}}}); !only.want("scale") || only.want("create-cold") {
		t.Errorf("--only scale: want scale alone")
	}
}

// Rows come figure by figure, each over the steps, so the table reads as
// a curve; the ratio and the restart's adoption are carried along.
func TestScaleMetricsOrder(t *testing.T) {
	steps := []scaleStep{
		{n: 10, exec: []float64{1, 2}, answered: 2, lsCLI: []float64{5}, lsREST: []float64{1}, runcList: []float64{3},
			create: []float64{100}, raw: []float64{60}, rssKiB: 300, rounds: []roundSample{{meter: 2, reap: 3, wall: 9}},
			restart: 2 * time.Second, adopted: 10},
		{n: 100, exec: []float64{1}, answered: 1, lsCLI: []float64{6}, lsREST: []float64{2}, runcList: []float64{4},
			create: []float64{150}, raw: []float64{90}, rssKiB: 200, rounds: []roundSample{{meter: 20, reap: 30, wall: 90}},
			restart: 3 * time.Second, adopted: 99, changed: 1},
	}
	ms := scaleMetrics("runc", steps, []float64{100}, []float64{50}, 40<<10)
	var got []string
	for _, m := range ms {
		got = append(got, m.Name)
	}
	var want []string
	for _, fig := range []string{"exec", "ls-cli", "ls-rest", "create", "rss", "round-cpu", "restart"} {
		want = append(want, "scale-"+fig+"@10", "scale-"+fig+"@100")
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("rows (-want +got):\n%s", d)
	}
	by := map[string]Metric{}
	for _, m := range ms {
		by[m.Name] = m
		if strings.Contains(m.Definition, "SCALEPAR") || strings.Contains(m.Definition, "SCALECR") {
			t.Errorf("%s: placeholders left in the definition", m.Name)
		}
	}
	if r := by["scale-create@100"].Derived["ratio_vs_0"]; r != 1.5 {
		t.Errorf("create@100 ratio_vs_0 = %v, want 1.5", r)
	}
	// The raw runtime at the same step is the row's baseline, with its own growth.
	if m := by["scale-create@100"]; m.Baseline == nil || !m.Baseline.Available || m.Baseline.Samples[0] != 90 ||
		m.Derived["raw_ratio_vs_0"] != 1.8 || m.Derived["raw_p50_at_0"] != 50 || strings.Contains(m.Baseline.Definition, "SCALECR") {
		t.Errorf("create@100 baseline = %+v, derived %v", m.Baseline, m.Derived)
	}
	if m := by["scale-round-cpu@100"]; len(m.Samples) != 1 || m.Samples[0] != 50 || m.Derived["metering_ms"] != 20 {
		t.Errorf("round-cpu@100 = %+v", m)
	}
	if m := by["scale-restart@100"]; m.Derived["adopted"] != 99 || m.Derived["new_pid"] != 1 || m.Samples[0] != 3000 {
		t.Errorf("restart@100 = %+v", m)
	}
}
