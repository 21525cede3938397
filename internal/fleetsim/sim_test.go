package fleetsim

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/report.md")

// goldenConfig is small enough to run in seconds and busy enough that
// requests wait: 12 nodes for 5,000 tasks a day.
func goldenConfig() Config {
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Days, cfg.TasksPerDay = 12, 1, 5000
	return cfg
}

// The report for a fixed seed is the golden file: a change to Place, the
// pool sizing, the mix or the metrics shows up as a diff of the table
// (regenerate with go test ./internal/fleetsim -run TestGoldenReport -update).
func TestGoldenReport(t *testing.T) {
	rep, err := Run(goldenConfig())
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "report.md")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), b.String()); diff != "" {
		t.Errorf("report differs from %s (-want +got):\n%s", path, diff)
	}
}

// The same seed gives the same report; another seed another trace.
func TestDeterministic(t *testing.T) {
	cfg := goldenConfig()
	cfg.SizeNodes = false
	cfg.Days = 0.25
	a, _ := Run(cfg)
	b, _ := Run(cfg)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Error("two runs with one seed differ")
	}
	t1 := Trace(1, DefaultMix(), 0.25, 1000)
	t2 := Trace(2, DefaultMix(), 0.25, 1000)
	if cmp.Equal(t1[:10], t2[:10]) {
		t.Error("seeds 1 and 2 gave the same trace")
	}
}

// The trace has the mix it claims: the kinds' shares, durations within
// their bounds, arrivals in order within the span, a peak by day.
func TestTrace(t *testing.T) {
	mix := DefaultMix()
	tr := Trace(5, mix, 2, 10000)
	if len(tr) != 20000 {
		t.Fatalf("%d tasks; want 20000", len(tr))
	}
	count := make([]int, len(mix))
	day, night := 0, 0
	for i, x := range tr {
		k := mix[x.Kind]
		count[x.Kind]++
		if x.Duration < k.Min || x.Duration > max(k.Max, 3*k.TailMedian) {
			t.Fatalf("task %d (%s) runs %s", i, k.Name, x.Duration)
		}
		if (i > 0 && x.Arrival < tr[i-1].Arrival) || x.Arrival >= 48*time.Hour+k.BatchSpread {
			t.Fatalf("task %d arrives at %s", i, x.Arrival)
		}
		switch h := (x.Arrival % (24 * time.Hour)).Hours(); {
		case h >= 11 && h < 16:
			day++
		case h < 5:
			night++
		}
	}
	for i, k := range mix {
		if got := float64(count[i]) / 20000; got < k.Share-0.01 || got > k.Share+0.01 {
			t.Errorf("%s: share %.3f; want %.2f", k.Name, got, k.Share)
		}
	}
	if day < 2*night {
		t.Errorf("5 peak hours hold %d arrivals, 5 night hours %d: no diurnal peak", day, night)
	}
}

// With ample nodes nobody waits and nothing is stranded; every policy
// places every task, and memory used is nearly the same under each (the
// trace decides it; placement only moves the start latency, a layer fetch
// holding memory 20 s longer).
func TestAmpleFleet(t *testing.T) {
	cfg := goldenConfig()
	cfg.Nodes, cfg.Days, cfg.SizeNodes = 40, 0.5, false
	rep, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.WaitedPct != 0 || r.StrandedGiBh != 0 || r.Tasks != 2500 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
		if d := r.MemoryUsedPct - rep.Results[0].MemoryUsedPct; d > 0.5 || d < -0.5 {
			t.Errorf("%s uses %.1f%% memory, berth %.1f%%", r.Policy, r.MemoryUsedPct, rep.Results[0].MemoryUsedPct)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mut   func(*Config)
		field string
	}{
		{func(c *Config) { c.Nodes = 0 }, "nodes"},
		{func(c *Config) { c.Days = 0 }, "days"},
		{func(c *Config) { c.TasksPerDay = 0 }, "tasks-per-day"},
		{func(c *Config) { c.HitRate = 1 }, "hit-rate"},
		{func(c *Config) { c.Node.MemoryMiB = 4096 }, "node"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		if _, err := Run(c); errs.FieldOf(err) != tc.field {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
}
