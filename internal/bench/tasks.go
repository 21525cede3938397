package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// Rows of the task ledger (issue 17, docs/TASKS.md).
const (
	defTaskStep       = "One step change of the task ledger: the clock starts when POST /v1/sandboxes/{id}/tasks/{task}/steps/{n}/done is sent (a pending step of a 256-step task on a running sandbox) and stops when its answer (the task) has been read; the server validates it, appends the change to the log and stores the task in one SQLite transaction."
	defTaskResume     = "Freeze resume of a sandbox whose task ledger is at its bound (64 tasks of 20 steps, 2 waiting gates each), the same clock as resume-freeze (POST /v1/sandboxes/{id}/resume sent → `echo ok` answered): the resume answer carries the ledger's summary. Baseline: the same on a sandbox with no ledger, alternating with it in the same run (which goes first alternates too); the ratio is the ledger's overhead on resume."
	defResumeNoLedger = "Freeze resume of a sandbox with no task ledger (resume-freeze's clock), alternated with the measured one."
)

// taskStep measures the "task-step" row.
func (r *Runner) taskStep(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "task-step", Runtime: rt, Unit: "ms", Definition: defTaskStep, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if _, err := r.c.Tasks(ctx, "bench0missing"); noRoute(err) {
		return fail("the task ledger has not landed: the server does not serve /v1/sandboxes/{id}/tasks")
	}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, sb.ID)
	steps := make([]string, 256)
	for i := range steps {
		steps[i] = "step-" + strconv.Itoa(i+1)
	}
	if _, err := r.c.CreateTask(ctx, sb.ID, wire.TaskCreateRequest{ID: "bench", Steps: steps}); err != nil {
		return fail("create task: " + err.Error())
	}
	for i := 0; i < r.o.Warmups+r.o.Runs && i < len(steps) && ctx.Err() == nil; i++ {
		start := time.Now()
		_, err := r.c.TaskStep(ctx, sb.ID, "bench", strconv.Itoa(i+1), "done", "")
		d := time.Since(start)
		switch {
		case err != nil:
			m.Errors = append(m.Errors, err.Error())
		case i >= r.o.Warmups:
			m.Samples = append(m.Samples, ms(d))
		}
		if len(m.Errors) > 3 {
			break
		}
	}
	return []Metric{m}
}

// taskResume measures the "resume-tasks" row against a sandbox without a ledger.
func (r *Runner) taskResume(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "resume-tasks", Runtime: rt, Unit: "ms", Definition: defTaskResume, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if !r.runtimeInfo(rt).Freeze {
		return fail("the server reports no freezer for " + rt)
	}
	if _, err := r.c.Tasks(ctx, "bench0missing"); noRoute(err) {
		return fail("the task ledger has not landed: the server does not serve /v1/sandboxes/{id}/tasks")
	}
	with, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, with.ID)
	without, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, without.ID)
	steps := make([]string, 20)
	for i := range steps {
		steps[i] = "step-" + strconv.Itoa(i+1)
	}
	for i := range 64 {
		id := "t" + strconv.Itoa(i)
		if _, err := r.c.CreateTask(ctx, with.ID, wire.TaskCreateRequest{ID: id, Steps: steps}); err != nil {
			return fail("create task: " + err.Error())
		}
		for g := range 2 {
			if _, err := r.c.AskTaskGate(ctx, with.ID, id, wire.TaskGateRequest{Question: "gate " + strconv.Itoa(g)}); err != nil {
				return fail("ask gate: " + err.Error())
			}
		}
	}
	var base []float64
	var baseErrs []string
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		// Which goes first alternates, so neither gains from its place
		// (the audit and timeline writers still commit the previous one's
		// entries while the next cycle starts).
		var dw, dn time.Duration
		var err, nerr error
		if i%2 == 0 {
			_, dw, err = r.pauseResume(ctx, with.ID, wire.PauseFreeze)
			_, dn, nerr = r.pauseResume(ctx, without.ID, wire.PauseFreeze)
		} else {
			_, dn, nerr = r.pauseResume(ctx, without.ID, wire.PauseFreeze)
			_, dw, err = r.pauseResume(ctx, with.ID, wire.PauseFreeze)
		}
		if err != nil {
			m.Errors = append(m.Errors, err.Error())
		}
		if nerr != nil {
			baseErrs = append(baseErrs, nerr.Error())
		}
		if i >= r.o.Warmups {
			if err == nil {
				m.Samples = append(m.Samples, ms(dw))
			}
			if nerr == nil {
				base = append(base, ms(dn))
			}
		}
		if len(m.Errors)+len(baseErrs) > 6 {
			break
		}
	}
	m.Baseline = baseline("resume-freeze, no ledger (same run)", defResumeNoLedger, base, baseErrs)
	m.Notes = fmt.Sprintf("ledger: %d tasks × %d steps, %d waiting gates", 64, len(steps), 128)
	return []Metric{m}
}
