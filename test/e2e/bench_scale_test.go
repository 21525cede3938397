package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestBenchSelfScale runs the scale row small (10, then 50 idle runc
// sandboxes) end to end: every sandbox answers exec at each step, the
// lists, creates, RSS and reaper rounds are measured, a restart of the
// server re-adopts every sandbox (same container PIDs), and nothing is
// left on the host. Timings are never asserted.
func TestBenchSelfScale(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runtime", "runc", "--only", "scale",
		"--scale-steps", "10,50", "--scale-rounds", "1", "--json", out)
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
	for _, n := range []int{10, 50} {
		row := func(fig string) bench.Metric {
			m, ok := got[fmt.Sprintf("scale-%s@%d", fig, n)]
			if !ok {
				t.Fatalf("no scale-%s@%d row in the report; rows: %v\n%s", fig, n, names(rep.Metrics), b)
			}
			return m
		}
		ex := row("exec")
		if ex.Derived["answered"] != float64(n) || len(ex.Samples) != n || len(ex.Errors) != 0 {
			t.Errorf("exec@%d: %v of %d answered, errors %q", n, ex.Derived["answered"], n, ex.Errors)
		}
		re := row("restart")
		if re.Derived["adopted"] != float64(n) || len(re.Samples) != 1 || len(re.Errors) != 0 {
			t.Errorf("restart@%d: %v of %d re-adopted (new pid %v, missing %v), errors %q", n, re.Derived["adopted"], n,
				re.Derived["new_pid"], re.Derived["missing"], re.Errors)
		}
		for _, fig := range []string{"ls-cli", "ls-rest", "create", "rss", "round-cpu"} {
			if m := row(fig); !m.Available || len(m.Samples) == 0 || len(m.Errors) != 0 {
				t.Errorf("%s@%d: available %v, %d samples, reason %q, errors %q", fig, n, m.Available, len(m.Samples), m.Reason, m.Errors)
			}
		}
		if ls := row("ls-cli"); ls.Baseline == nil || !ls.Baseline.Available {
			t.Errorf("ls-cli@%d: no runc list baseline: %+v", n, ls.Baseline)
		}
		if cr := row("create"); cr.Baseline == nil || !cr.Baseline.Available || len(cr.Baseline.Errors) != 0 || cr.Derived["raw_ratio_vs_0"] <= 0 {
			t.Errorf("create@%d: no raw runc run baseline: %+v (derived %v)", n, cr.Baseline, cr.Derived)
		}
	}
}

func names(ms []bench.Metric) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}
