package admission

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestSeriesNormalize(t *testing.T) {
	now := time.Date(2026, 3, 4, 10, 17, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		in    SeriesQuery
		want  SeriesQuery
		field string
	}{
		{"defaults", SeriesQuery{}, SeriesQuery{By: "owner", Step: time.Hour,
			From: time.Date(2026, 3, 3, 10, 0, 0, 0, time.UTC), To: time.Date(2026, 3, 4, 11, 0, 0, 0, time.UTC)}, ""},
		{"days align to UTC midnight", SeriesQuery{By: "template", Step: 24 * time.Hour, From: now.Add(-72 * time.Hour)},
			SeriesQuery{By: "template", Step: 24 * time.Hour, From: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
				To: time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC)}, ""},
		{"to on a boundary stays", SeriesQuery{From: now.Add(-2 * time.Hour), To: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)},
			SeriesQuery{By: "owner", Step: time.Hour, From: time.Date(2026, 3, 4, 8, 0, 0, 0, time.UTC),
				To: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}, ""},
		{"bad by", SeriesQuery{By: "sandbox"}, SeriesQuery{}, "by"},
		{"sub-hour step", SeriesQuery{Step: 30 * time.Minute}, SeriesQuery{}, "step"},
		{"ragged step", SeriesQuery{Step: 90 * time.Minute}, SeriesQuery{}, "step"},
		{"too many points", SeriesQuery{From: now.Add(-2000 * time.Hour)}, SeriesQuery{}, "step"},
		{"from after to", SeriesQuery{From: now, To: now.Add(-3 * time.Hour)}, SeriesQuery{}, "from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Normalize(now)
			if tc.field != "" {
				if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
					t.Fatalf("err = %v, want InvalidArgument on %q", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestBucketSeries(t *testing.T) {
	p := metering.Prices{VCPUHour: 1, MemoryGiBHour: 0.5, DiskGiBHour: 0}
	h0 := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	res := sandbox.Resources{CPUMillis: 1000, MemoryMiB: 2048}
	// Each row: a full running hour reserving 1 vCPU + 2 GiB (reserved 2.0),
	// using cpu vCPU-hours and no memory (active = cpu).
	row := func(h int, owner, tpl string, cpu float64) store.UsageHour {
		return store.UsageHour{Hour: h0.Add(time.Duration(h) * time.Hour), Usage: metering.Usage{SandboxID: owner + tpl,
			Owner: owner, Template: tpl, Reserved: res, RunningSeconds: 3600, CPUSeconds: cpu * 3600}}
	}
	rows := []store.UsageHour{
		row(-1, "alice", "py", 1), // before From: dropped
		row(0, "alice", "py", 0.5), row(1, "alice", "node", 0.25), row(1, "bob", "py", 1),
		row(5, "bob", "py", 0.1),
		row(6, "alice", "py", 1), // at To: dropped
	}
	q := SeriesQuery{By: SeriesByOwner, Step: 2 * time.Hour, From: h0, To: h0.Add(6 * time.Hour)}
	buckets := []time.Time{h0, h0.Add(2 * time.Hour), h0.Add(4 * time.Hour)}
	approx := cmpopts.EquateApprox(0, 1e-9)
	for _, tc := range []struct {
		by   string
		want []SeriesLine
	}{
		{SeriesByOwner, []SeriesLine{
			{Key: "alice", Reserved: []float64{4, 0, 0}, Active: []float64{0.75, 0, 0}, TotalReserved: 4, TotalActive: 0.75},
			{Key: "bob", Reserved: []float64{2, 0, 2}, Active: []float64{1, 0, 0.1}, TotalReserved: 4, TotalActive: 1.1},
		}},
		{SeriesByTemplate, []SeriesLine{
			{Key: "node", Reserved: []float64{2, 0, 0}, Active: []float64{0.25, 0, 0}, TotalReserved: 2, TotalActive: 0.25},
			{Key: "py", Reserved: []float64{4, 0, 2}, Active: []float64{1.5, 0, 0.1}, TotalReserved: 6, TotalActive: 1.6},
		}},
	} {
		t.Run(tc.by, func(t *testing.T) {
			q.By = tc.by
			got := BucketSeries(rows, q, p)
			if diff := cmp.Diff(buckets, got.Buckets); diff != "" {
				t.Errorf("buckets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got.Lines, approx); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
	if got := BucketSeries(nil, q, p); len(got.Lines) != 0 || len(got.Buckets) != 3 {
		t.Errorf("no rows: %+v", got)
	}
}

// An owner's series holds only its own usage, the admin's every owner's;
// orphans say what they cost per day on both bases.
func TestUsageSeriesScopeAndOrphanRates(t *testing.T) {
	a, c := newTest(t, fastConfig())
	ctx := t.Context()
	h0 := t0.Truncate(time.Hour)
	mk(t, c, "al1", "alice", sandbox.Running, small, sandbox.Attrs{})
	mk(t, c, "bo1", "bob", sandbox.Stopped, small, sandbox.Attrs{})
	mk(t, c, "wp1", pool.Owner, sandbox.Running, small, sandbox.Attrs{Pool: sandbox.PoolState{Member: "tiny"}}) // not an orphan
	inc := metering.Usage{RunningSeconds: 3600, CPUSeconds: 360}
	cur := func(id, owner string) metering.Usage {
		return metering.Usage{SandboxID: id, Owner: owner, Template: "tiny", Reserved: small, CreatedAt: t0,
			LastSampleAt: h0.Add(time.Hour), DiskBytes: 1 << 20}
	}
	if err := c.st.RecordUsage(ctx, []store.UsageRecord{{Usage: cur("al1", "alice"), Hour: h0, Inc: inc},
		{Usage: cur("bo1", "bob"), Hour: h0.Add(time.Hour), Inc: inc}}); err != nil {
		t.Fatal(err)
	}
	c.set(h0.Add(3 * time.Hour))
	keys := func(owner string) []string {
		s, err := a.UsageSeries(ctx, owner, SeriesQuery{From: h0})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range s.Lines {
			if l.TotalReserved <= 0 || l.TotalActive <= 0 {
				t.Errorf("line %s has no cost: %+v", l.Key, l)
			}
			out = append(out, l.Key)
		}
		return out
	}
	if got := keys("alice"); !cmp.Equal(got, []string{"alice"}) {
		t.Errorf("alice's series: %v", got)
	}
	if got := keys(""); !cmp.Equal(got, []string{"alice", "bob"}) {
		t.Errorf("admin's series: %v", got)
	}
	if _, err := a.UsageSeries(ctx, "Not An Owner", SeriesQuery{}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("bad owner: %v", err)
	}

	rep, err := a.Orphans(ctx, "", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := fastConfig().Prices
	got := map[string][2]float64{}
	for _, o := range rep.Items {
		if o.Kind == "sandbox" {
			got[o.ID] = [2]float64{o.CostPerDayReserved, o.CostPerDayActive}
		}
	}
	u := inc
	u.Reserved = small
	want := map[string][2]float64{
		"al1": {metering.ReservedPerDay(metering.BucketRunning, small, p), metering.ActivePerDay(metering.BucketRunning, u, 0, p)},
		"bo1": {metering.ReservedPerDay(metering.BucketStopped, small, p), metering.ActivePerDay(metering.BucketStopped, u, 1<<20, p)},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("orphan rates (-want +got):\n%s", diff)
	}
	if want["al1"][0] <= want["bo1"][0] || want["al1"][1] <= want["bo1"][1] || want["bo1"][1] <= 0 {
		t.Errorf("a running orphan should cost more per day than a stopped one: %v", want)
	}
}
