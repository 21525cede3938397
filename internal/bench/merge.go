package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// defMerge is the definition of the "merge" row (issue 18's figure, goal
// ≤ 500 ms).
const defMerge = "Merge of a 100-file diff into the parent: a fork edits line 3 and the parent line 15 of each of 100 text files (20 lines each, in the exec user's home: on runsc /tmp is not part of the root filesystem), so the plan is 100 clean line merges; the clock starts when POST /v1/sandboxes/{parent}/merges is sent and stops when it answers with the merge applied (child captured, plan, stage, freeze, verify, commit). Derived <phase>_p50 are the p50s of the server's own phases_ms of the measured merges (docs/MERGES.md: capture, plan, store, prepare, journal, stage, freeze, verify, commit, finish)."

const mergeFiles = 100

// merge measures the "merge" row.
func (r *Runner) merge(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "merge", Runtime: rt, Unit: "ms", Definition: defMerge, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if _, err := r.c.Merges(ctx, "bench0missing"); noRoute(err) {
		return fail("merge has not landed: the server does not serve /v1/sandboxes/{id}/merges")
	}
	parent, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, parent.ID)
	setup := "mkdir -p $HOME/m && for i in $(seq 1 " + strconv.Itoa(mergeFiles) + "); do seq 1 20 > $HOME/m/f$i; done"
	if res, err := r.c.Exec(ctx, parent.ID, "sh", "-c", setup); err != nil || res.ExitCode != 0 {
		return fail(fmt.Sprintf("writing %d files: %v (exit %d)", mergeFiles, err, res.ExitCode))
	}
	phases := map[string][]float64{}
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		d, ph, err := r.mergeSample(ctx, parent.ID, i)
		switch {
		case err != nil:
			m.Errors = append(m.Errors, err.Error())
		case i >= r.o.Warmups:
			m.Samples = append(m.Samples, ms(d))
			for k, v := range ph {
				phases[k] = append(phases[k], v)
			}
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	if len(phases) > 0 {
		m.Derived = map[string]float64{}
		for k, v := range phases {
			m.Derived[k+"_p50"] = Percentile(v, 50)
		}
	}
	return []Metric{m}
}

// mergeSample forks the parent, makes both sides edit every file, and
// times the merge request.
func (r *Runner) mergeSample(ctx context.Context, parent string, i int) (time.Duration, map[string]float64, error) {
	fr, err := r.c.Fork(ctx, parent, 1)
	if err != nil {
		return 0, nil, err
	}
	if len(fr.Sandboxes) != 1 {
		return 0, nil, fmt.Errorf("fork made %d children: %s", len(fr.Sandboxes), fr.Reason)
	}
	child := fr.Sandboxes[0].ID
	defer r.remove(ctx, child)
	tag := strconv.Itoa(i)
	for _, e := range []struct{ id, script string }{
		{child, "sed -i 3s/.*/child" + tag + "/ $HOME/m/f*"},
		{parent, "sed -i 15s/.*/parent" + tag + "/ $HOME/m/f*"},
	} {
		if res, err := r.c.Exec(ctx, e.id, "sh", "-c", e.script); err != nil || res.ExitCode != 0 {
			return 0, nil, fmt.Errorf("edit in %s: %v (exit %d)", e.id, err, res.ExitCode)
		}
	}
	start := time.Now()
	mg, err := r.c.Merge(ctx, parent, wire.MergeRequest{Source: child})
	d := time.Since(start)
	if err != nil {
		return 0, nil, err
	}
	if mg.State == "conflicted" {
		detail := ""
		if l, err := r.c.Conflicts(ctx, parent); err == nil && len(l) > 0 {
			detail = fmt.Sprintf(" (first: %s %s: %s)", l[0].Kind, l[0].Path, l[0].Message)
		}
		_, _ = r.c.AbortMerge(ctx, parent, mg.ID)
		return 0, nil, fmt.Errorf("merge %s: %d conflict(s)%s, want a clean merge", mg.ID, mg.Conflicts, detail)
	}
	if mg.State != "applied" || mg.Writes < mergeFiles {
		return 0, nil, fmt.Errorf("merge %s: state %s, %d writes, %d conflicts (want applied, ≥ %d writes)", mg.ID, mg.State, mg.Writes, mg.Conflicts, mergeFiles)
	}
	return d, mg.PhasesMs, nil
}
