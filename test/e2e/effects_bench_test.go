package e2e

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestEffectsHTTPSRow runs the bench row effects-https (an HTTPS POST from
// inside a sandbox to an effectful host, recorded by the ledger, against
// the same POST to the host not effectful, alternating; definition in
// internal/bench/effects_linux.go) on runc and logs the medians. Timings
// are not asserted; every sample must be measured, every recorded POST
// must be in the sandbox's ledger and every request must have reached the
// upstream.
func TestEffectsHTTPSRow(t *testing.T) {
	testutil.RequireRoot(t)
	up, err := bench.StartHTTPSUpstream(20 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	bin := testutil.BuildBinaries(t)
	s := startServerFrom(t, bin, "--egress-hosts", up.HostsFile, "--upstream-ca", up.CAFile)
	const runs = 4
	r, err := bench.NewRunner(bench.NewClient(s.url, s.key), bench.Options{Only: []string{"effects-https"}, Runs: runs, Warmups: 1,
		Runtimes: []string{"runc"}, Template: "tiny", BerthBin: filepath.Join(bin, "berth"), Upstream: up}, nil, errors.New("no raw baselines here"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const perExec = 3 // timed POSTs per client run
	for _, m := range rep.Metrics {
		if !m.Available || m.Summary == nil || m.Summary.N != runs*perExec || m.Baseline == nil || m.Baseline.Summary == nil ||
			m.Baseline.Summary.N != runs*perExec || len(m.Errors) > 0 {
			t.Fatalf("%s on %s: %+v", m.Name, m.Runtime, m)
		}
		// Every POST of the effectful sandbox (warm-up and first requests
		// too) is recorded; every request of the three series reached the
		// upstream.
		rounds := runs + 1
		if got, want := m.Derived["effects_recorded"], float64(rounds*(perExec+1)); got != want {
			t.Errorf("%v effects recorded, want %v", got, want)
		}
		if got, want := m.Derived["upstream_requests"], float64(3*rounds*(perExec+1)); got != want {
			t.Errorf("%v requests reached the upstream, want %v", got, want)
		}
		if !strings.Contains(m.Definition, "effectful") || m.Derived["intercepted_get_p50_ms"] <= 0 {
			t.Errorf("definition or GET series missing: %+v", m)
		}
		t.Logf("effects-https %s: p50 %.1f ms (p95 %.1f) vs %.1f ms (p95 %.1f) not effectful, GET intercepted %.1f ms: ratio %.3f",
			m.Runtime, m.Summary.P50, m.Summary.P95, m.Baseline.Summary.P50, m.Baseline.Summary.P95, m.Derived["intercepted_get_p50_ms"], *m.Ratio)
	}
}
