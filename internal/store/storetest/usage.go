package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func suiteUsage(t *testing.T, s store.Store) {
	ctx := t.Context()
	h0 := suiteEpoch.Truncate(time.Hour)
	cursor := func(id, owner string, sampled time.Time) metering.Usage {
		return metering.Usage{SandboxID: id, Owner: owner, Template: "tiny", State: sandbox.Running,
			Reserved:  sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048},
			CreatedAt: suiteEpoch, LastSampleAt: sampled, LastCPUNanos: 7e9, DiskBytes: 1 << 20,
			LastActiveAt: sampled, Signals: `{"x":1}`}
	}
	inc := metering.Usage{CPUSeconds: 2, MemGiBSeconds: 3, MemPeakBytes: 100, RunningSeconds: 10,
		FrozenSeconds: 1, PausedSeconds: 2, StoppedSeconds: 3, DiskGiBHours: 0.5}
	// Two steps in hour 0 for sb1 (summed, peak maxed), one in hour 2, one for bob's sb2.
	inc2 := inc
	inc2.MemPeakBytes = 300
	for _, recs := range [][]store.UsageRecord{
		{{Usage: cursor("sb1", "alice", h0.Add(time.Minute)), Hour: h0.Add(time.Minute), Inc: inc},
			{Usage: cursor("sb2", "bob", h0.Add(time.Minute)), Hour: h0, Inc: inc}},
		{{Usage: cursor("sb1", "alice", h0.Add(2*time.Minute)), Hour: h0.Add(2 * time.Minute), Inc: inc2}},
		{{Usage: cursor("sb1", "alice", h0.Add(2*time.Hour)), Hour: h0.Add(2 * time.Hour), Inc: inc}},
		// Cursor-only update (no hour).
		{{Usage: func() metering.Usage {
			u := cursor("sb1", "alice", h0.Add(3*time.Hour))
			u.State = sandbox.Deleted
			return u
		}()}},
	} {
		if err := s.RecordUsage(ctx, recs); err != nil {
			t.Fatalf("RecordUsage: %v", err)
		}
	}
	want1 := cursor("sb1", "alice", h0.Add(3*time.Hour))
	want1.State = sandbox.Deleted
	want1.CPUSeconds, want1.MemGiBSeconds, want1.MemPeakBytes = 6, 9, 300
	want1.RunningSeconds, want1.FrozenSeconds, want1.PausedSeconds, want1.StoppedSeconds, want1.DiskGiBHours = 30, 3, 6, 9, 1.5
	want2 := cursor("sb2", "bob", h0.Add(time.Minute))
	want2.CPUSeconds, want2.MemGiBSeconds, want2.MemPeakBytes = 2, 3, 100
	want2.RunningSeconds, want2.FrozenSeconds, want2.PausedSeconds, want2.StoppedSeconds, want2.DiskGiBHours = 10, 1, 2, 3, 0.5

	since := want1
	since.CPUSeconds, since.MemGiBSeconds, since.MemPeakBytes = 2, 3, 100
	since.RunningSeconds, since.FrozenSeconds, since.PausedSeconds, since.StoppedSeconds, since.DiskGiBHours = 10, 1, 2, 3, 0.5
	empty := want2
	empty.CPUSeconds, empty.MemGiBSeconds, empty.MemPeakBytes = 0, 0, 0
	empty.RunningSeconds, empty.FrozenSeconds, empty.PausedSeconds, empty.StoppedSeconds, empty.DiskGiBHours = 0, 0, 0, 0, 0

	for _, tc := range []struct {
		name string
		f    store.UsageFilter
		want []metering.Usage
	}{
		{"all", store.UsageFilter{}, []metering.Usage{want1, want2}},
		{"owner", store.UsageFilter{Owner: "bob"}, []metering.Usage{want2}},
		{"sandbox", store.UsageFilter{SandboxID: "sb1"}, []metering.Usage{want1}},
		{"since truncates to the hour", store.UsageFilter{Since: h0.Add(time.Hour + 30*time.Minute)}, []metering.Usage{since, empty}},
		{"nobody", store.UsageFilter{Owner: "carol"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListUsage(ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, suiteOpts); diff != "" {
				t.Errorf("ListUsage (-want +got):\n%s", diff)
			}
		})
	}
	if err := s.RecordUsage(ctx, []store.UsageRecord{{Usage: metering.Usage{SandboxID: "BAD"}}}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("RecordUsage(bad id) = %v, want invalid_argument", err)
	}
}

func suiteQuotas(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.GetQuota(ctx, "alice"); errs.KindOf(err) != errs.NotFound {
		t.Fatalf("GetQuota(missing) = %v, want not_found", err)
	}
	a := quota.Limits{Sandboxes: 3, CPU: 2.5, MemoryMiB: 4096, DiskMiB: 10240, Snapshots: 5}
	b := quota.Limits{Sandboxes: 1}
	for _, step := range []struct {
		owner string
		l     quota.Limits
	}{{"alice", quota.Limits{Sandboxes: 9}}, {"alice", a}, {"bob", b}} {
		if err := s.PutQuota(ctx, step.owner, step.l); err != nil {
			t.Fatalf("PutQuota: %v", err)
		}
	}
	got, err := s.GetQuota(ctx, "alice")
	if err != nil || got != a {
		t.Fatalf("GetQuota = %+v, %v; want %+v", got, err, a)
	}
	all, err := s.ListQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]quota.Limits{"alice": a, "bob": b}, all); diff != "" {
		t.Errorf("ListQuotas (-want +got):\n%s", diff)
	}
	if err := s.DeleteQuota(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteQuota(ctx, "bob"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("DeleteQuota(again) = %v, want not_found", err)
	}
	if err := s.PutQuota(ctx, "x", quota.Limits{CPU: -1}); errs.FieldOf(err) != "cpu" {
		t.Errorf("PutQuota(negative) = %v, want field cpu", err)
	}
	if err := s.PutQuota(ctx, "", a); errs.FieldOf(err) != "owner" {
		t.Errorf("PutQuota(no owner) = %v, want field owner", err)
	}
}
