package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestBenchSelfOneshot runs the one-shot and cli-call rows end to end: the
// berth cycle as three CLI processes, podman's when podman is installed
// (the row says why not otherwise), and the CLI's overhead. Timings are
// never asserted.
func TestBenchSelfOneshot(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runs", "2", "--warmup", "0",
		"--runtime", "runc", "--only", "oneshot,cli-call", "--json", out)
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
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report is not a bench.Report: %v\n%s", err, raw)
	}
	got := map[string]bench.Metric{}
	for _, m := range rep.Metrics {
		got[m.Name] = m
	}
	os1 := got["oneshot"]
	if !os1.Available || os1.Runtime != "runc" || len(os1.Samples) != 2 || len(os1.Errors) != 0 || !hasKeys(os1.Derived, "create_p50", "exec_p50", "rm_p50") {
		t.Errorf("oneshot: want 2 samples and the phases, got %+v", os1)
	}
	_, lookErr := exec.LookPath("podman")
	switch {
	case os1.Baseline == nil:
		t.Errorf("oneshot: no baseline")
	case lookErr == nil && (!os1.Baseline.Available || len(os1.Baseline.Samples) != 2 || os1.Ratio == nil):
		t.Errorf("oneshot: podman is installed, want its 2 samples: %+v", os1.Baseline)
	case lookErr != nil && (os1.Baseline.Available || !strings.Contains(os1.Notes, "not available")):
		t.Errorf("oneshot: podman is not installed, want the row to say so: %+v %q", os1.Baseline, os1.Notes)
	}
	cc := got["cli-call"]
	if !cc.Available || len(cc.Samples) < 50 || cc.Baseline == nil || !cc.Baseline.Available || !hasKeys(cc.Derived, "overhead_ms") {
		t.Errorf("cli-call: want ≥ 50 samples, a baseline and overhead_ms, got %+v", cc)
	}
}
