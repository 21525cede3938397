package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
)

var ciRows = []string{"code-interpreter-tti", "code-interpreter-tti-warm", "code-interpreter-rtt"}

// benchJSON runs `berth bench --only rows` against s and decodes the report.
func benchJSON(t *testing.T, s *server, runs string, rows ...string) map[string]bench.Metric {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bench.json")
	cmd := exec.Command(filepath.Join(s.bin, "berth"), "bench", "--runs", runs, "--warmup", "0",
		"--only", strings.Join(rows, ","), "--json", out)
	cmd.Env = s.env(s.key)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("berth bench: %v\n%s", err, b)
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
	if len(got) != len(rows) {
		t.Errorf("want %v only, got %d metrics", rows, len(rep.Metrics))
	}
	return got
}

// TestBenchCodeInterpreter checks the shape of the code-interpreter rows of
// `berth bench`: "not available" (with the reason) on a server without the
// code-interpreter-v1 template; with it (put in by
// scripts/code-interpreter-template.sh, as test/e2b/run.sh does), n samples
// each, the warm row's samples all pool hits. Timings are never asserted.
func TestBenchCodeInterpreter(t *testing.T) {
	tars, _ := filepath.Glob("/var/cache/berth/rootfs/default-*.tar")
	if len(tars) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("no default template in /var/cache/berth/rootfs (scripts/setup.sh builds it)")
		}
		t.Skip("no default template in /var/cache/berth/rootfs")
	}
	s := startServer(t, "--no-default-template=false")
	for name, m := range benchJSON(t, s, "1", ciRows...) {
		if m.Available || !strings.Contains(m.Reason, "not available") || !strings.Contains(m.Reason, "code-interpreter-v1") || m.Definition == "" {
			t.Errorf("%s without the template: want not available with a reason and a definition, got %+v", name, m)
		}
	}

	rpWaitFor(t, 5*time.Minute, "template default to be ready", func() bool {
		out, _ := s.run("template", "ls")
		return containsLine(out, "default", "ready")
	})
	cmd := exec.Command("bash", "../../scripts/code-interpreter-template.sh", filepath.Join(s.bin, "berth"), s.dataDir)
	cmd.Env = s.env(s.key)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("code-interpreter-template.sh: %v\n%s", err, b)
	}
	got := benchJSON(t, s, "2", ciRows...)
	for _, name := range ciRows {
		m, ok := got[name]
		if !ok {
			t.Errorf("%s missing from the report", name)
			continue
		}
		if !m.Available || len(m.Samples) != 2 || len(m.Errors) != 0 || m.Summary == nil || m.Summary.N != 2 || m.Definition == "" || m.Unit != "ms" {
			t.Errorf("%s: want 2 samples in ms with a definition and no errors, got %+v", name, m)
		}
	}
	if d := got["code-interpreter-tti-warm"].Derived; d == nil || d["pool_hits"] < 2 || d["pool_misses"] != 0 {
		t.Errorf("code-interpreter-tti-warm: want 2 pool hits and no miss in derived, got %v", d)
	}
	// The bench deleted what it created.
	if out, code := s.run("ls"); code != 0 || strings.Contains(out, "code-interpreter-v1") {
		t.Errorf("sandboxes left after the bench (%d):\n%s", code, out)
	}
}
