package admission

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// Each charge bills the CPU used since the previous one to the phase named.
func TestCPUMeterCharges(t *testing.T) {
	clock := []time.Duration{10, 13, 20, 21}
	m := &cpuMeter{now: func() time.Duration { v := clock[0]; clock = clock[1:]; return v }}
	m.last = m.now()
	m.charge(&m.meter) // 10 → 13
	m.charge(&m.reap)  // 13 → 20
	m.charge(&m.meter) // 20 → 21
	if m.meter != 4 || m.reap != 7 {
		t.Errorf("meter %v reap %v, want 4 and 7", m.meter, m.reap)
	}
}

// A round reports how many sandboxes it visited and what it cost, in
// LastRound and in /metrics.
func TestRoundStats(t *testing.T) {
	a, c := newTest(t, fastConfig())
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c"} {
		mk(t, c, id, "alice", sandbox.Running, small, sandbox.Attrs{})
	}
	if got := a.LastRound(); got.Rounds != 0 {
		t.Fatalf("a round before any ran: %+v", got)
	}
	r := a.NewReaper(c)
	r.Round(ctx)
	c.set(t0.Add(10 * time.Second))
	r.Round(ctx)
	got := a.LastRound()
	if got.Rounds != 2 || got.Sandboxes != 3 || got.Wall <= 0 || got.CPU() <= 0 || !got.At.Equal(t0.Add(10*time.Second)) {
		t.Errorf("LastRound = %+v, want round 2 over 3 sandboxes at t0+10s with wall and CPU > 0", got)
	}
	var b strings.Builder
	if err := a.WriteMetrics(ctx, &b, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"berth_reaper_rounds_total 2\n", "berth_reaper_round_sandboxes 3\n",
		`berth_reaper_round_cpu_seconds{phase="metering"} `, `berth_reaper_round_cpu_seconds{phase="reaping"} `, "berth_reaper_round_seconds ",
		"berth_reaper_round_start_seconds " + strconv.FormatFloat(float64(t0.Add(10*time.Second).Unix()), 'g', -1, 64) + "\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
