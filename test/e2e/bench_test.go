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
		"--only", "create-cold,exec-rtt,throughput,pause-freeze", "--json", out)
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
	for name, wantBaseline := range map[string]bool{"create-cold": true, "exec-rtt": true, "throughput": false,
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
	for _, m := range rep.Metrics {
		if !slices.Contains([]string{"create-cold", "exec-rtt", "throughput", "pause-freeze", "resume-freeze"}, m.Name) {
			t.Errorf("unselected metric %s measured", m.Name)
		}
	}
	// --from renders the same report without measuring.
	md, err := exec.Command(filepath.Join(bin, "berth"), "bench", "--from", out, "--markdown").CombinedOutput()
	if err != nil || !strings.Contains(string(md), "| create-cold | runc | ms |") {
		t.Errorf("bench --from --markdown: %v\n%s", err, md)
	}
}
