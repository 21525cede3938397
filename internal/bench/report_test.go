package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// sampleReport covers every shape a metric takes: with a baseline, without
// one, with derived numbers, notes and failed samples, and not available.
func sampleReport() *Report {
	r := &Report{
		Schema: Schema, StartedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Command: "berth bench --self --runs 3",
		Machine: Machine{Cores: 2, MemoryBytes: 24 << 30, Kernel: "6.18.44", CPUModel: "AMD EPYC", OS: "linux/amd64"},
		Server:  Server{URL: "http://127.0.0.1:7070", Version: "dev", Self: true, Template: "tiny", Runtimes: []string{"runc", "runsc"}},
		Runs:    3, Warmups: 1,
		Metrics: []Metric{
			{Name: "create-cold", Runtime: "runc", Unit: "ms", Definition: defCreateCold, Available: true,
				Samples:  []float64{210, 230, 220},
				Baseline: &Baseline{Name: "runc run", Definition: "raw", Available: true, Samples: []float64{100, 120, 110}}},
			{Name: "throughput", Runtime: "runsc", Unit: "ms", Definition: defThroughput, Available: true,
				Samples: []float64{400, 500}, Derived: map[string]float64{"per_second": 2.2222222222222223},
				Errors: []string{"POST /v1/sandboxes: HTTP 503: busy"}},
			{Name: "density", Runtime: "runc", Unit: "MiB", Definition: defDensity, Available: true,
				Samples: []float64{3.5, 3.25, 3.75}, Derived: map[string]float64{"per_gib": 315.0769230769231}},
			{Name: "create-warm", Runtime: "runc", Unit: "ms", Definition: defCreateWarm,
				Reason: "warm pools have not landed: the server does not serve /v1/pools"},
			{Name: "fork", Runtime: "runc", Unit: "ms", Definition: defFork, Available: true,
				Samples:  []float64{1500, 1700, 1600},
				Baseline: &Baseline{Name: "cp -a ×10", Definition: defCpWS, Available: true, Samples: []float64{400, 420, 410}},
				Derived:  map[string]float64{"children_disk": 30},
				Notes:    "30 children fork_mode disk; runtime runc cannot checkpoint memory here: no criu"},
			{Name: "pause-memory", Runtime: "runsc", Unit: "ms", Definition: defPauseMem, Available: true,
				Samples:  []float64{900, 1000, 1100},
				Baseline: &Baseline{Name: "runsc checkpoint", Definition: defRawCkpt, Reason: "raw runtime baselines need root"}},
		},
	}
	for i := range r.Metrics {
		r.Metrics[i].Finish()
	}
	return r
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update rewrites it):\n%s", path, diff)
	}
}

func TestReportJSONGolden(t *testing.T) {
	got, err := json.MarshalIndent(sampleReport(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "report.json", append(got, '\n'))

	// The schema round-trips: a report read back (berth bench --from) is the same report.
	var back Report
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sampleReport(), &back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestReportMetricInvariants(t *testing.T) {
	for _, m := range sampleReport().Metrics {
		if m.Samples == nil {
			t.Errorf("%s: samples must be [] not null", m.Label())
		}
		if m.Summary != nil && m.Summary.N != len(m.Samples) {
			t.Errorf("%s: summary n %d != %d samples", m.Label(), m.Summary.N, len(m.Samples))
		}
		if m.Baseline != nil && m.Baseline.Summary != nil && m.Summary != nil {
			if m.Ratio == nil || *m.Ratio != m.Summary.P50/m.Baseline.Summary.P50 {
				t.Errorf("%s: ratio %v, want p50/baseline p50", m.Label(), m.Ratio)
			}
		} else if m.Ratio != nil {
			t.Errorf("%s: ratio without both sides", m.Label())
		}
	}
}

func TestTableGolden(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	golden(t, "table.txt", b.Bytes())
}

func TestMarkdownGolden(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	golden(t, "markdown.md", b.Bytes())
}

func TestWant(t *testing.T) {
	r := &Runner{o: Options{Only: []string{"upload", "exec-rtt"}}}
	for name, want := range map[string]bool{"upload-64MiB": true, "upload-1000x4KiB": true, "download-64MiB": false,
		"exec-rtt": true, "exec": false, "create-cold": false} {
		if got := r.want(name); got != want {
			t.Errorf("want(%q) = %v", name, got)
		}
	}
	if _, err := NewRunner(nil, Options{Runs: 1, Only: []string{"nope"}}, nil, nil); err == nil {
		t.Error("an unknown --only name must be rejected")
	}
}

// Without podman the one-shot baseline is not available, and says why.
func TestPodmanMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	p, err := newPodmanEnv(t.Context(), "x")
	if p != nil || err == nil || err.Error() != "podman is not installed" {
		t.Fatalf("newPodmanEnv without podman = %v, %v", p, err)
	}
}
