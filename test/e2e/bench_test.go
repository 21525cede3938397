package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestBenchSelf runs `berth bench --self` end to end and checks the report's
// shape: every selected metric present with n=3 raw samples and its
// baseline where it has one. Timings are never asserted.
func TestBenchSelf(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runs", "3", "--runtime", "runc",
		"--only", "create-cold,exec-rtt,delete,throughput,pause-freeze,burst", "--burst", "4", "--json", out)
	cmd.Env = append(os.Environ(), "BERTH_URL=http://127.0.0.1:1", "BERTH_API_KEY=unused")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("berth bench: %v\n%s", err, b)
	}
	if strings.Contains(string(b), "stopping the server") {
		t.Errorf("bench did not clean up its server:\n%s", b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	var rep bench.Report
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("report is not a bench.Report: %v\n%s", err, raw)
	}
	if rep.Schema != bench.Schema || rep.Runs != 3 || rep.Machine.Cores < 1 || rep.Machine.Kernel == "" || !rep.Server.Self {
		t.Errorf("report header: %+v", rep)
	}
	got := map[string]bench.Metric{}
	for _, m := range rep.Metrics {
		got[m.Name] = m
	}
	for name, wantBaseline := range map[string]bool{"create-cold": true, "exec-rtt": true, "delete": true, "throughput": false,
		"pause-freeze": false, "resume-freeze": false} {
		m, ok := got[name]
		if !ok {
			t.Errorf("%s missing from the report", name)
			continue
		}
		if m.Runtime != "runc" || m.Definition == "" || !m.Available || len(m.Samples) != 3 || m.Summary == nil || m.Summary.N != 3 {
			t.Errorf("%s: want 3 samples on runc with a definition, got %+v", name, m)
		}
		if wantBaseline {
			if m.Baseline == nil || !m.Baseline.Available || len(m.Baseline.Samples) != 3 || m.Ratio == nil {
				t.Errorf("%s: want a baseline with 3 samples and a ratio, got %+v", name, m.Baseline)
			}
		} else if m.Baseline != nil {
			t.Errorf("%s: unexpected baseline %+v", name, m.Baseline)
		}
	}
	// burst: one sample per sandbox of the 4, beside 4 raw runs at once.
	if m := got["burst"]; len(m.Samples) != 4 || m.Derived["success_rate"] != 1 || m.Derived["wall_ms"] <= 0 ||
		m.Baseline == nil || !m.Baseline.Available || len(m.Baseline.Samples) != 4 || m.Derived["baseline_wall_ms"] <= 0 {
		t.Errorf("burst: want 4 samples, all answered, and a 4-container raw baseline with its wall, got %+v (baseline %+v)", m, m.Baseline)
	}
	for _, m := range rep.Metrics {
		if !slices.Contains([]string{"create-cold", "exec-rtt", "delete", "throughput", "pause-freeze", "resume-freeze", "burst"}, m.Name) {
			t.Errorf("unselected metric %s measured", m.Name)
		}
	}
	// --from renders the same report without measuring.
	md, err := exec.Command(filepath.Join(bin, "berth"), "bench", "--from", out, "--markdown").CombinedOutput()
	if err != nil || !strings.Contains(string(md), "| create-cold | runc | ms |") {
		t.Errorf("bench --from --markdown: %v\n%s", err, md)
	}
}

// TestBenchSelfPoolFork measures create-warm (a warm pool on tiny) and
// fork (10 children of a sandbox with 100 MiB) and checks the report's
// shape: every sample a pool hit and every fork complete (a miss or a
// short fork is a failed sample, not a sample), the pool counters and the
// children's fork_mode recorded. Timings are never asserted.
func TestBenchSelfPoolFork(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runs", "2", "--warmup", "0",
		"--runtime", "runc", "--only", "create-warm,fork", "--json", out)
	cmd.Env = append(os.Environ(), "BERTH_URL=http://127.0.0.1:1", "BERTH_API_KEY=unused")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("berth bench: %v\n%s", err, b)
	}
	if strings.Contains(string(b), "stopping the server") || strings.Contains(string(b), "after its removal") {
		t.Errorf("bench did not clean up its server or its pool:\n%s", b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report is not a bench.Report: %v\n%s", err, raw)
	}
	got := map[string]bench.Metric{}
	for _, m := range rep.Metrics {
		got[m.Name] = m
	}
	if len(got) != 2 {
		t.Errorf("want create-warm and fork only, got %d metrics", len(rep.Metrics))
	}
	for _, name := range []string{"create-warm", "fork"} {
		m := got[name]
		if !m.Available || len(m.Samples) != 2 || m.Baseline == nil || !m.Baseline.Available || m.Ratio == nil {
			t.Errorf("%s: want 2 samples and a baseline, got %+v", name, m)
		}
	}
	if d := got["create-warm"].Derived; d == nil || !hasKeys(d, "pool_hits", "pool_misses") {
		t.Errorf("create-warm: want pool_hits and pool_misses in derived, got %v", d)
	}
	fork := got["fork"]
	if !strings.Contains(fork.Notes, "fork_mode") || !(hasKeys(fork.Derived, "children_memory") || hasKeys(fork.Derived, "children_disk")) {
		t.Errorf("fork: want the children's fork_mode in notes and derived, got %q %v", fork.Notes, fork.Derived)
	}
}

func hasKeys(m map[string]float64, keys ...string) bool {
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}
