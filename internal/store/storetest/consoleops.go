package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// suiteUsageHours: hour buckets come back one row per (hour, sandbox) with
// the sandbox's owner, template and reserved size, filtered by owner and
// by [From, To).
func suiteUsageHours(t *testing.T, s store.Store) {
	ctx := t.Context()
	h0 := suiteEpoch.Truncate(time.Hour)
	res := sandbox.Resources{CPUMillis: 500, MemoryMiB: 256, DiskMiB: 1024}
	cursor := func(id, owner, tpl string, at time.Time) metering.Usage {
		return metering.Usage{SandboxID: id, Owner: owner, Template: tpl, State: sandbox.Running, Reserved: res,
			CreatedAt: h0, LastSampleAt: at}
	}
	inc := metering.Usage{CPUSeconds: 1, MemGiBSeconds: 2, MemPeakBytes: 10, RunningSeconds: 60, DiskGiBHours: 0.25}
	for _, recs := range [][]store.UsageRecord{
		{{Usage: cursor("a1", "alice", "py", h0.Add(time.Minute)), Hour: h0.Add(time.Minute), Inc: inc},
			{Usage: cursor("b1", "bob", "node", h0.Add(time.Minute)), Hour: h0, Inc: inc}},
		{{Usage: cursor("a1", "alice", "py", h0.Add(2*time.Minute)), Hour: h0.Add(2 * time.Minute), Inc: inc}},
		{{Usage: cursor("a1", "alice", "py", h0.Add(3*time.Hour)), Hour: h0.Add(3 * time.Hour), Inc: inc}},
	} {
		if err := s.RecordUsage(ctx, recs); err != nil {
			t.Fatalf("RecordUsage: %v", err)
		}
	}
	// A pool member claimed in hour 3: that hour is the claimer's, hour 0
	// stays the pool's.
	for _, recs := range [][]store.UsageRecord{
		{{Usage: cursor("p1", "_pool", "py", h0.Add(time.Minute)), Hour: h0, Inc: inc}},
		{{Usage: cursor("p1", "_pool", "py", h0.Add(3*time.Hour)), Hour: h0.Add(3 * time.Hour), Inc: inc}},
		{{Usage: cursor("p1", "carol", "py", h0.Add(3*time.Hour+time.Minute)), Hour: h0.Add(3 * time.Hour), Inc: inc}},
	} {
		if err := s.RecordUsage(ctx, recs); err != nil {
			t.Fatalf("RecordUsage: %v", err)
		}
	}
	row := func(hour time.Time, id, owner, tpl string, n float64) store.UsageHour {
		return store.UsageHour{Hour: hour, Usage: metering.Usage{SandboxID: id, Owner: owner, Template: tpl, State: sandbox.Running,
			Reserved: res, CPUSeconds: n, MemGiBSeconds: 2 * n, MemPeakBytes: 10, RunningSeconds: 60 * n, DiskGiBHours: 0.25 * n}}
	}
	for _, tc := range []struct {
		name string
		f    store.UsageHoursFilter
		want []store.UsageHour
	}{
		{"all", store.UsageHoursFilter{}, []store.UsageHour{row(h0, "a1", "alice", "py", 2), row(h0, "b1", "bob", "node", 1),
			row(h0, "p1", "_pool", "py", 1), row(h0.Add(3*time.Hour), "a1", "alice", "py", 1),
			row(h0.Add(3*time.Hour), "p1", "carol", "py", 2)}},
		{"claimed hour is the claimer's", store.UsageHoursFilter{Owner: "carol"}, []store.UsageHour{row(h0.Add(3*time.Hour), "p1", "carol", "py", 2)}},
		{"earlier hours stay the pool's", store.UsageHoursFilter{Owner: "_pool"}, []store.UsageHour{row(h0, "p1", "_pool", "py", 1)}},
		{"owner", store.UsageHoursFilter{Owner: "bob"}, []store.UsageHour{row(h0, "b1", "bob", "node", 1)}},
		{"from truncated to the hour", store.UsageHoursFilter{From: h0.Add(30 * time.Minute), Owner: "alice"},
			[]store.UsageHour{row(h0, "a1", "alice", "py", 2), row(h0.Add(3*time.Hour), "a1", "alice", "py", 1)}},
		{"empty range", store.UsageHoursFilter{From: h0.Add(90 * time.Minute), To: h0.Add(3 * time.Hour)}, []store.UsageHour{}},
		{"from inside the last hour", store.UsageHoursFilter{From: h0.Add(3*time.Hour + time.Minute), Owner: "alice"},
			[]store.UsageHour{row(h0.Add(3*time.Hour), "a1", "alice", "py", 1)}},
		{"to is exclusive", store.UsageHoursFilter{To: h0.Add(3 * time.Hour)}, []store.UsageHour{row(h0, "a1", "alice", "py", 2),
			row(h0, "b1", "bob", "node", 1), row(h0, "p1", "_pool", "py", 1)}},
		{"nobody", store.UsageHoursFilter{Owner: "dave"}, []store.UsageHour{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.UsageHours(ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, suiteOpts); diff != "" {
				t.Errorf("UsageHours(%+v) (-want +got):\n%s", tc.f, diff)
			}
		})
	}
}

// suiteTemplateBuilds: builds are listed newest first per template, bad
// rows are refused naming the field, and a template keeps only its newest
// MaxTemplateBuilds rows.
func suiteTemplateBuilds(t *testing.T, s store.Store) {
	ctx := t.Context()
	b := func(tpl string, i int, result string) store.TemplateBuild {
		start := suiteEpoch.Add(time.Duration(i) * time.Minute)
		return store.TemplateBuild{Template: tpl, Kind: store.BuildDocker, Source: "dockerfile Dockerfile", StartedAt: start,
			EndedAt: start.Add(1500 * time.Millisecond), Result: result, Fingerprint: fmt.Sprintf("fp%d", i), Layers: i}
	}
	var want []store.TemplateBuild
	for i, r := range []string{store.TemplateReady, store.TemplateFailed, store.TemplateReady} {
		in := b("py", i, r)
		if r == store.TemplateFailed {
			in.Error, in.Fingerprint = "step 2: exit status 1", ""
		}
		seq, err := s.AppendTemplateBuild(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		in.Seq = seq
		want = append([]store.TemplateBuild{in}, want...)
	}
	other := b("node", 9, store.TemplateReady)
	other.Kind = store.BuildPull
	if other.Seq, _ = s.AppendTemplateBuild(ctx, other); other.Seq <= want[0].Seq {
		t.Fatalf("seq %d not after %d", other.Seq, want[0].Seq)
	}
	got, err := s.ListTemplateBuilds(ctx, "py", 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListTemplateBuilds(py) (-want +got):\n%s", diff)
	}
	if got[0].Duration() != 1500*time.Millisecond {
		t.Errorf("Duration = %v", got[0].Duration())
	}
	if got, _ := s.ListTemplateBuilds(ctx, "", 2); len(got) != 2 || got[0].Template != "node" || got[1].Seq != want[0].Seq {
		t.Errorf("ListTemplateBuilds(all, 2) = %+v", got)
	}
	for _, tc := range []struct {
		field string
		mod   func(*store.TemplateBuild)
	}{
		{"template", func(b *store.TemplateBuild) { b.Template = "" }},
		{"kind", func(b *store.TemplateBuild) { b.Kind = "docker" }},
		{"result", func(b *store.TemplateBuild) { b.Result = "building" }},
		{"ended_at", func(b *store.TemplateBuild) { b.EndedAt = b.StartedAt.Add(-time.Second) }},
	} {
		in := b("py", 1, store.TemplateReady)
		tc.mod(&in)
		_, err := s.AppendTemplateBuild(ctx, in)
		if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
			t.Errorf("bad %s: got %v (kind %v, field %q)", tc.field, err, errs.KindOf(err), errs.FieldOf(err))
		}
	}
	for i := range store.MaxTemplateBuilds + 5 {
		if _, err := s.AppendTemplateBuild(ctx, b("big", i, store.TemplateReady)); err != nil {
			t.Fatal(err)
		}
	}
	got, err = s.ListTemplateBuilds(ctx, "big", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != store.MaxTemplateBuilds || got[0].Layers != store.MaxTemplateBuilds+4 || got[len(got)-1].Layers != 5 {
		t.Errorf("trimmed history: %d rows, newest %d, oldest %d", len(got), got[0].Layers, got[len(got)-1].Layers)
	}
}
