package e2b

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/store"
)

func TestSnapshotPage(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var sns []store.Snapshot
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		sns = append(sns, store.Snapshot{ID: id, CreatedAt: t0.Add(time.Duration(i) * time.Minute)})
	}
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		page, next, err := snapshotPage(append([]store.Snapshot(nil), sns...), 2, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range page {
			got = append(got, sn.ID)
		}
		if next == "" {
			break
		}
		token = next
	}
	if diff := cmp.Diff([]string{"e", "d", "c", "b", "a"}, got); diff != "" {
		t.Errorf("newest first, every snapshot once (-want +got)\n%s", diff)
	}
	if _, _, err := snapshotPage(sns, 2, "zzz"); err == nil {
		t.Error("an unknown token was accepted")
	}
}

func TestMetricsHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var h metricsHistory
	st := admission.SandboxStats{StartedAt: t0, CPUMillis: 2000, MemLimit: 1 << 30, DiskLimit: 1 << 31}
	read := func(at time.Duration, cpu time.Duration, mem uint64) []metricJSON {
		st.At, st.CPUNanos, st.MemBytes = t0.Add(at), uint64(cpu), mem
		return h.record("sb", st)
	}
	read(10*time.Second, 5*time.Second, 100)         // 5 s of CPU in 10 s on 2 cores: 25%
	read(10*time.Second+100*time.Millisecond, 0, 0)  // too close: not a new reading
	got := read(20*time.Second, 25*time.Second, 200) // 20 s in 10 s on 2 cores: 100%
	if len(got) != 2 {
		t.Fatalf("readings = %+v, want 2", got)
	}
	if got[0].CPUUsedPct != 25 || got[1].CPUUsedPct != 100 || got[1].MemUsed != 200 || got[1].CPUCount != 2 {
		t.Errorf("readings = %+v", got)
	}
	if r := inRange(got, t0.Add(15*time.Second).Unix(), 0); len(r) != 1 || r[0].MemUsed != 200 {
		t.Errorf("from 15 s = %+v", r)
	}
	if r := inRange(got, 0, t0.Add(5*time.Second).Unix()); len(r) != 0 {
		t.Errorf("until 5 s = %+v", r)
	}
	for i := range maxMetricSamples + 10 {
		read(30*time.Second+time.Duration(i)*2*time.Second, 30*time.Second, 1)
	}
	if n := len(h.series("sb")); n != maxMetricSamples {
		t.Errorf("kept %d readings, want %d", n, maxMetricSamples)
	}
	// A restarted sandbox (resumed from disk): CPU counts from the new start.
	st.StartedAt = t0.Add(time.Hour)
	got = read(time.Hour+10*time.Second, 10*time.Second, 1)
	if last := got[len(got)-1]; last.CPUUsedPct != 50 {
		t.Errorf("after a restart = %+v, want 50%%", last)
	}
}
