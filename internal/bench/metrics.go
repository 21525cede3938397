package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const (
	defCreateCold = "Clock starts when POST /v1/sandboxes is sent (no warm pool) and stops when `echo ok`, exec'd through POST /v1/sandboxes/{id}/exec right after the create answered, has streamed back \"ok\" and its exit status. Deletion is outside the clock."
	defRawRun     = "`RT run` in the foreground of `/bin/echo ok` with the config.json berth generates, over an overlay of the same busybox rootfs on a fresh loop-mounted ext4 workspace; the rootfs is mounted before the clock starts, and the clock stops when the runtime has exited with \"ok\" printed."
	defCreateWarm = "As create-cold (same request: template, runtime, default resources), but served from a warm pool of 3 of that template and runtime, refilled to 3 outside the clock before every sample; a create not claimed from the pool (no extra.claimed_from_pool) is a failed sample. pool_hits, pool_misses: the pool's counters over the run."
	defExecRTT    = "Clock starts when POST /v1/sandboxes/{id}/exec of `true` is sent to a running sandbox and stops when its exit event has been read from the stream. Derived sandbox_spawn_ms: the runtime's own floor in the same sandbox, what one fork+exec+wait of /bin/true costs inside it (a shell loop of 200 spawns minus the same loop of none, over 200, p50 of 3 such pairs)."
	defForkExec   = "fork+exec of the host's `true` and wait for its exit (Go os/exec)."
	defThroughput = "One sample is one sequential cycle: POST /v1/sandboxes (answers when the agent is ready) then DELETE /v1/sandboxes/{id} answered. per_second = 1000 / mean cycle ms."
	defDelete     = "Clock starts when DELETE /v1/sandboxes/{id} of a running sandbox (created, and `echo ok` answered, before the clock) is sent and stops when it answers: the sandbox is recorded as deleted and no process of it runs; its unmounts, network detach and directory removal finish after the answer (the daemon's debug log has each step: \"sandbox deleted\" and \"sandbox teardown finished\")."
	defRawDelete  = "`RT delete --force` of a running container of `sleep` started with `RT run --detach` from the config.json berth generates, over an overlay of the same busybox rootfs on a loop-mounted ext4 workspace; the clock covers that one command."
	defBurst      = "N creates sent at once, each followed by `echo ok`; one sample per sandbox: from the moment all N were released to its own `echo ok` output. wall_ms: until the last answered; success_rate: sandboxes that answered / N."
	defRawBurst   = "N `RT run` of `/bin/echo ok` started at once, each as the create-cold baseline (berth's config.json, its own fresh ext4 workspace, all prepared before the clock); one sample per container: from the release to its exit with \"ok\" printed. Derived baseline_wall_ms: until the last exited."
	defPauseFrz   = "Clock starts when POST /v1/sandboxes/{id}/pause {mode: freeze} is sent and stops when it answers (cgroup freezer; memory kept)."
	defResumeFrz  = "Clock starts when POST /v1/sandboxes/{id}/resume of a frozen sandbox is sent and stops when a following `echo ok` exec has returned its output."
)

func (r *Runner) createCold(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "create-cold", Runtime: rt, Unit: "ms", Definition: defCreateCold, Available: true}
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		sb, err := r.create(ctx, rt)
		if err != nil {
			return 0, err
		}
		defer r.remove(ctx, sb.ID)
		if err := r.c.EchoOK(ctx, sb.ID); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	bname := rt + " run"
	if r.raw == nil {
		m.Baseline = unavailableBaseline(bname, strings.ReplaceAll(defRawRun, "RT", rt), r.rawEr)
	} else {
		s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) { return r.raw.EchoOK(ctx, rt) })
		m.Baseline = baseline(bname, strings.ReplaceAll(defRawRun, "RT", rt), s, e)
	}
	return []Metric{m}
}

func (r *Runner) execRTT(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "exec-rtt", Runtime: rt, Unit: "ms", Definition: defExecRTT, Available: true}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "create failed: "+err.Error())}
	}
	defer r.remove(ctx, sb.ID)
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		res, err := r.c.Exec(ctx, sb.ID, "true")
		d := time.Since(start)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return d, err
	})
	if v, ok := r.sandboxSpawn(ctx, sb.ID); ok {
		m.Derived = map[string]float64{"sandbox_spawn_ms": v}
	}
	trueBin, err := exec.LookPath("true")
	if err != nil {
		m.Baseline = unavailableBaseline("host fork+exec", defForkExec, err)
		return []Metric{m}
	}
	s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		err := exec.CommandContext(ctx, trueBin).Run()
		return time.Since(start), err
	})
	m.Baseline = baseline("host fork+exec", defForkExec, s, e)
	return []Metric{m}
}

// sandboxSpawn is what one fork+exec+wait of /bin/true costs inside
// sandbox id (see defExecRTT), in ms.
func (r *Runner) sandboxSpawn(ctx context.Context, id string) (float64, bool) {
	const n = 200
	loop := func(k int) (time.Duration, error) {
		script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", k)
		start := time.Now()
		res, err := r.c.Exec(ctx, id, "/bin/sh", "-c", script)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("spawn loop exited %d", res.ExitCode)
		}
		return time.Since(start), err
	}
	var per []float64
	for range 3 {
		with, err := loop(n)
		if err != nil {
			return 0, false
		}
		without, err := loop(0)
		if err != nil {
			return 0, false
		}
		per = append(per, ms(with-without)/n)
	}
	s := Summarize(per)
	if s == nil {
		return 0, false
	}
	return s.P50, true
}

func (r *Runner) throughput(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "throughput", Runtime: rt, Unit: "ms", Definition: defThroughput, Available: true}
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		sb, err := r.create(ctx, rt)
		if err != nil {
			return 0, err
		}
		if err := r.c.Delete(ctx, sb.ID); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	if s := Summarize(m.Samples); s != nil && s.Mean > 0 {
		m.Derived = map[string]float64{"per_second": 1000 / s.Mean}
	}
	return []Metric{m}
}

func (r *Runner) deleteRunning(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "delete", Runtime: rt, Unit: "ms", Definition: defDelete, Available: true}
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		sb, err := r.create(ctx, rt)
		if err != nil {
			return 0, err
		}
		if err := r.c.EchoOK(ctx, sb.ID); err != nil {
			r.remove(ctx, sb.ID)
			return 0, err
		}
		start := time.Now()
		if err := r.c.Delete(ctx, sb.ID); err != nil {
			r.remove(ctx, sb.ID)
			return 0, err
		}
		return time.Since(start), nil
	})
	bname := rt + " delete --force"
	if r.raw == nil {
		m.Baseline = unavailableBaseline(bname, strings.ReplaceAll(defRawDelete, "RT", rt), r.rawEr)
	} else {
		s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) { return r.raw.DeleteRunning(ctx, rt) })
		m.Baseline = baseline(bname, strings.ReplaceAll(defRawDelete, "RT", rt), s, e)
	}
	return []Metric{m}
}

// BurstSize is the default number of concurrent creates: 100, or 4×runs
// when runs is small, so that a quick run stays quick.
func BurstSize(runs int) int {
	if runs >= 25 {
		return 100
	}
	return max(4, 4*runs)
}

func (r *Runner) burst(ctx context.Context, rt string) []Metric {
	n := r.o.Burst
	if n <= 0 {
		n = BurstSize(r.o.Runs)
	}
	m := Metric{Name: "burst", Runtime: rt, Unit: "ms", Definition: defBurst, Available: true}
	// The baseline first: its containers are gone when it returns, while
	// berth's sandboxes finish their teardown in the server's background.
	bname := fmt.Sprintf("%s run × %d", rt, n)
	def := strings.ReplaceAll(defRawBurst, "RT", rt)
	rawWall := time.Duration(-1)
	if r.raw == nil {
		m.Baseline = unavailableBaseline(bname, def, r.rawEr)
	} else {
		lat, wall, e := r.raw.EchoOKBurst(ctx, rt, n)
		if m.Baseline = baseline(bname, def, lat, e); len(lat) > 0 {
			rawWall = wall
		}
	}
	if r.o.Warmups > 0 { // one create to warm caches (template layers, runtime binary)
		if sb, err := r.create(ctx, rt); err == nil {
			r.remove(ctx, sb.ID)
		}
	}
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	gate := make(chan struct{})
	lat := make([]float64, n)
	errList := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			start := time.Now()
			sb, err := r.create(ctx, rt)
			if err != nil {
				errList[i] = err
				return
			}
			mu.Lock()
			ids = append(ids, sb.ID)
			mu.Unlock()
			if err := r.c.EchoOK(ctx, sb.ID); err != nil {
				errList[i] = err
				return
			}
			lat[i] = ms(time.Since(start))
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(start)
	ok := 0
	m.Samples = []float64{}
	for i := range n {
		if errList[i] != nil {
			m.Errors = append(m.Errors, errList[i].Error())
			continue
		}
		ok++
		m.Samples = append(m.Samples, lat[i])
	}
	m.Derived = map[string]float64{"concurrency": float64(n), "wall_ms": ms(wall), "success_rate": float64(ok) / float64(n)}
	if rawWall >= 0 {
		m.Derived["baseline_wall_ms"] = ms(rawWall)
	}
	r.removeAll(ctx, ids)
	return []Metric{m}
}

// removeAll deletes ids, a few at a time.
func (r *Runner) removeAll(ctx context.Context, ids []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r.remove(ctx, id)
		}()
	}
	wg.Wait()
}

func (r *Runner) freezePause(ctx context.Context, rt string) []Metric {
	p := Metric{Name: "pause-freeze", Runtime: rt, Unit: "ms", Definition: defPauseFrz, Available: true}
	q := Metric{Name: "resume-freeze", Runtime: rt, Unit: "ms", Definition: defResumeFrz, Available: true}
	if !r.runtimeInfo(rt).Freeze {
		return []Metric{notAvailable(p.Name, rt, p.Unit, p.Definition, "the server reports no freezer for "+rt),
			notAvailable(q.Name, rt, q.Unit, q.Definition, "the server reports no freezer for "+rt)}
	}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return []Metric{notAvailable(p.Name, rt, p.Unit, p.Definition, "create failed: "+err.Error()),
			notAvailable(q.Name, rt, q.Unit, q.Definition, "create failed: "+err.Error())}
	}
	defer r.remove(ctx, sb.ID)
	p.Samples, q.Samples = []float64{}, []float64{}
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		dp, dr, err := r.pauseResume(ctx, sb.ID, wire.PauseFreeze)
		if err != nil {
			p.Errors = append(p.Errors, err.Error())
			if len(p.Errors) > 3 {
				break
			}
			continue
		}
		if i >= r.o.Warmups {
			p.Samples, q.Samples = append(p.Samples, ms(dp)), append(q.Samples, ms(dr))
		}
	}
	q.Errors = p.Errors
	return []Metric{p, q}
}

// pauseResume times one pause in mode (which must be honoured, not fallen
// back from) and one resume until `echo ok` answers.
func (r *Runner) pauseResume(ctx context.Context, id string, mode wire.PauseMode) (pause, resume time.Duration, err error) {
	start := time.Now()
	sb, err := r.c.Pause(ctx, id, mode)
	pause = time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	if sb.PauseActual != mode {
		err = fmt.Errorf("pause %s fell back to %q: %s", mode, sb.PauseActual, sb.Message)
	}
	start = time.Now()
	if _, rerr := r.c.Resume(ctx, id); rerr != nil {
		return 0, 0, errors.Join(err, rerr)
	}
	if eerr := r.c.EchoOK(ctx, id); eerr != nil {
		return 0, 0, errors.Join(err, eerr)
	}
	return pause, time.Since(start), err
}

type runtimeCaps struct {
	Freeze, Checkpoint bool
	Reason             string
}

func (r *Runner) runtimeInfo(rt string) (out runtimeCaps) {
	for _, x := range r.info.Runtimes {
		if x.Name == rt {
			out = runtimeCaps{Freeze: x.Freeze, Checkpoint: x.Checkpoint, Reason: x.CheckpointReason}
		}
	}
	return out
}
