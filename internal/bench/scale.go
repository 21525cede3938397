package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/network"
)

// The scale row (issue 14, "Scale"): idle sandboxes accumulate step by
// step (10, 100, 1,000 by default) on one server the bench started, and at
// each step the same figures are taken, so that the report shows how each
// grows with N and not only its end point.

// DefaultScaleSteps are --scale-steps' default.
var DefaultScaleSteps = []int{10, 100, 1000}

const (
	scaleParallel   = 4  // creates and exec checks in flight (a 2-core host)
	scaleListCalls  = 20 // samples per list figure
	scaleCreateRuns = 5  // extra sandboxes timed create → first output per step

	defScaleExec    = "Every sandbox of the step (N idle sandboxes of the template, created SCALEPAR at a time) runs `true` through the REST exec stream, SCALEPAR at a time; one sample per sandbox: request sent → exit event read. answered = how many exited 0; create_wall_s = wall time of the step's creates."
	defScaleLsCLI   = "`berth ls` as a whole process (spawn → exit, every page) with N sandboxes on the server, 20 calls one after the other. Baseline: `runc --root DATA/runtime/runc list --format json` as a whole process over the same N containers."
	defScaleLsREST  = "GET /v1/sandboxes, every page (client.ListAll), from the warm bench process with N sandboxes on the server, 20 calls; the clock stops when the last page is decoded."
	defScaleCreate  = "With N idle sandboxes on the server, SCALECR extra sandboxes one after the other: create request sent → `echo ok`'s output back (each deleted after, outside the clock). ratio_vs_0 = p50 / the p50 of the same measured before the first sandbox existed."
	defScaleRaw     = "SCALECR raw `RT run` of `echo ok` one after the other with the step's N sandboxes on the host, each as create-cold's baseline (its rootfs prepared outside the clock). raw_ratio_vs_0 = their p50 / the p50 of the same before the first sandbox existed: how much the runtime alone slows on a host holding N sandboxes."
	defScaleRSS     = "The server process's VmRSS (/proc/PID/status) with N idle sandboxes, minus its VmRSS before the first sandbox, divided by N (KiB per sandbox), read after the step's reaper rounds. rss_mib = the VmRSS itself. The server's RSS only: the sandboxes' own processes are in their cgroups."
	defScaleRound   = "CPU of one reaper round with N sandboxes (the loop that samples every sandbox's cgroup and disk for metering, asks every agent for its activity and decides): the server's berth_reaper_round_cpu_seconds (getrusage of the daemon plus the runtime commands it waited for, taken around each phase of the round), over rounds that started after the step's extra sandboxes were torn down (2 unless --scale-rounds says otherwise), so that nothing else runs in the daemon meanwhile. metering_ms and reaping_ms split the p50 round; wall_ms is the round's wall time."
	defScaleRestart = "SIGTERM to the server with N running sandboxes, wait for it to exit (stop_ms), start it again on the same data dir (clock starts at the spawn), then every sandbox is sent `true` (SCALEPAR at a time, each retried until it exits 0): the clock stops at the last answer. adopted = sandboxes whose container still has the same PID as before the stop (runc list), so they were re-adopted, not recreated."
)

// scaleStep is what one step measured.
type scaleStep struct {
	n                          int
	createWall                 time.Duration
	createErr                  []string
	exec                       []float64
	execErr                    []string
	answered                   int
	lsCLI, lsREST, runcList    []float64
	lsCLIErr, lsRESTErr, rlErr []string
	create                     []float64
	createErrs                 []string
	raw                        []float64 // the raw `runc run` baseline at this step
	rawErrs                    []string
	rssKiB                     float64
	rssErr                     error
	rounds                     []roundSample
	roundErr                   error
	restart                    time.Duration
	stop                       time.Duration
	adopted, changed, missing  int
	restartErr                 []string
}

type roundSample struct{ meter, reap, wall float64 } // ms

// scale runs the steps; it needs a server of its own (--self): it restarts
// it and reads its RSS from /proc.
func (r *Runner) scale(ctx context.Context, rt string) []Metric {
	srv := r.o.Server
	if srv == nil {
		return []Metric{notAvailable("scale", rt, "ms", defScaleExec, "needs --self: the scale row restarts the server and reads its RSS")}
	}
	steps := r.o.ScaleSteps
	if len(steps) == 0 {
		steps = DefaultScaleSteps
	}
	var ids []string
	var idsMu sync.Mutex
	host0 := hostFootprint(srv.DataDir, nil)
	leak := ""
	var cleanOnce sync.Once
	// Never leave N sandboxes behind, whatever happened on the way.
	clean := func() {
		cleanOnce.Do(func() {
			r.logf("scale: deleting %d sandboxes", len(ids))
			r.removeAll(ctx, ids)
			leak = waitFootprint(srv.DataDir, ids, host0, 5*time.Minute) // teardown is background work: ~1 s of ruleset loads per batch at 1,000
			if leak != "" {
				r.logf("scale: left on the host after cleanup: %s", leak)
			}
		})
	}
	defer clean()
	rss0, err := processRSSKiB(srv.PID())
	if err != nil {
		return []Metric{notAvailable("scale", rt, "ms", defScaleExec, err.Error())}
	}
	r.logf("scale: create → first output with no sandbox (baseline of the ratio)")
	create0, _ := r.scaleCreates(ctx, rt)
	raw0, _ := r.scaleRaw(ctx, rt)

	var out []scaleStep
	for _, n := range steps {
		if ctx.Err() != nil {
			break
		}
		st := scaleStep{n: n}
		need := n - len(ids)
		r.logf("scale: step %d: creating %d sandboxes", n, need)
		start := time.Now()
		var failed atomic.Int64
		parallel(need, scaleParallel, func(int) {
			if failed.Load() > 10 {
				return // the host is refusing: report, do not hammer it
			}
			sb, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.TTL = "3h" })
			idsMu.Lock()
			defer idsMu.Unlock()
			if err != nil {
				failed.Add(1)
				st.createErr = append(st.createErr, err.Error())
				return
			}
			ids = append(ids, sb.ID)
		})
		st.createWall = time.Since(start)
		r.logf("scale: step %d: %d sandboxes in %s, %d failed; exec check", n, len(ids), st.createWall.Round(time.Millisecond), len(st.createErr))
		st.exec, st.execErr = r.scaleExecAll(ctx, ids, 0)
		st.answered = len(st.exec)

		r.logf("scale: step %d: lists", n)
		for range scaleListCalls {
			t := time.Now()
			if _, err := r.cli(ctx, "ls"); err != nil {
				st.lsCLIErr = append(st.lsCLIErr, err.Error())
			} else {
				st.lsCLI = append(st.lsCLI, ms(time.Since(t)))
			}
			t = time.Now()
			if _, err := r.c.ListAll(ctx, client.ListOptions{}); err != nil {
				st.lsRESTErr = append(st.lsRESTErr, err.Error())
			} else {
				st.lsREST = append(st.lsREST, ms(time.Since(t)))
			}
			t = time.Now()
			if _, err := runcList(ctx, r.runcBin(), srv.DataDir); err != nil {
				st.rlErr = append(st.rlErr, err.Error())
			} else {
				st.runcList = append(st.runcList, ms(time.Since(t)))
			}
		}
		r.logf("scale: step %d: create → first output", n)
		st.create, st.createErrs = r.scaleCreates(ctx, rt)
		st.raw, st.rawErrs = r.scaleRaw(ctx, rt)

		r.logf("scale: step %d: reaper rounds", n)
		// Only rounds that start once the extra sandboxes' teardown is
		// over: the round's CPU is the process's, and a ruleset load of a
		// teardown (an nft child) would be billed to it.
		waitSandboxDirs(srv.DataDir, len(ids), time.Minute)
		st.rounds, st.roundErr = r.scaleRounds(ctx, len(ids), cmp.Or(r.o.ScaleRounds, 2), time.Now())
		if rss, err := processRSSKiB(srv.PID()); err != nil {
			st.rssErr = err
		} else if len(ids) > 0 {
			st.rssKiB = float64(rss-rss0) / float64(len(ids))
		}

		r.logf("scale: step %d: restart", n)
		r.scaleRestart(ctx, srv, ids, &st)
		r.logf("scale: step %d: restart %s (stop %s), %d adopted, %d new pid, %d missing",
			n, st.restart.Round(time.Millisecond), st.stop.Round(time.Millisecond), st.adopted, st.changed, st.missing)
		out = append(out, st)
	}
	clean()
	rows := scaleMetrics(rt, out, create0, raw0, rss0)
	for i := range rows {
		if strings.HasPrefix(rows[i].Name, "scale-exec@") {
			if leak != "" {
				rows[i].Errors = append(rows[i].Errors, "left on the host after cleanup: "+leak)
			} else {
				rows[i].Notes += "; after cleanup: no mount, loop device, cgroup or veth left"
			}
		}
	}
	return rows
}

// waitSandboxDirs waits until the server holds n sandbox directories (the
// background half of deletes has finished) or limit has passed.
func waitSandboxDirs(dataDir string, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if es, err := os.ReadDir(filepath.Join(dataDir, "sandboxes")); err != nil || len(es) <= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFootprint waits until the host holds no more than before (deletes
// answer before their teardown ends) and says what is still left.
func waitFootprint(dataDir string, ids []string, before footprint, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for {
		left := hostFootprint(dataDir, ids).minus(before)
		if left == "" || time.Now().After(deadline) {
			return left
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runcBin is the runc the server drives (the host's; the same lookup as serve's).
func (r *Runner) runcBin() string {
	if b := r.o.RuntimeBins["runc"]; b != "" {
		return b
	}
	return "runc"
}

// scaleCreates times create → first output of a few extra sandboxes.
func (r *Runner) scaleCreates(ctx context.Context, rt string) ([]float64, []string) {
	var samples []float64
	var errList []string
	for range scaleCreateRuns {
		start := time.Now()
		sb, err := r.create(ctx, rt)
		if err == nil {
			err = r.c.EchoOK(ctx, sb.ID)
		}
		d := time.Since(start)
		if sb != nil {
			r.remove(ctx, sb.ID)
		}
		if err != nil {
			errList = append(errList, err.Error())
			continue
		}
		samples = append(samples, ms(d))
	}
	return samples, errList
}

// scaleRaw is scale-create's baseline: the raw runtime's `echo ok` (as
// create-cold's) with the step's sandboxes on the host. What grows with N
// there is the runtime's own cost of a host that holds N sandboxes'
// mounts (runc reads /proc/self/mountinfo several times per run).
func (r *Runner) scaleRaw(ctx context.Context, rt string) ([]float64, []string) {
	if r.raw == nil {
		return nil, []string{"no raw runtime: " + fmt.Sprint(cmp.Or(r.rawEr, errors.New("not set up")))}
	}
	var samples []float64
	var errList []string
	for range scaleCreateRuns {
		d, err := r.raw.EchoOK(ctx, rt)
		if err != nil {
			errList = append(errList, err.Error())
			continue
		}
		samples = append(samples, ms(d))
	}
	return samples, errList
}

// scaleExecAll runs `true` in every sandbox; with retryFor > 0 each one is
// retried until it answers or retryFor has passed (after a restart).
func (r *Runner) scaleExecAll(ctx context.Context, ids []string, retryFor time.Duration) ([]float64, []string) {
	var mu sync.Mutex
	var samples []float64
	var errList []string
	parallel(len(ids), scaleParallel, func(i int) {
		deadline := time.Now().Add(retryFor)
		for {
			t := time.Now()
			res, err := r.c.Exec(ctx, ids[i], "true")
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exec %s: true exited %d", ids[i], res.ExitCode)
			}
			d := time.Since(t)
			if err != nil && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			mu.Lock()
			if err != nil {
				errList = append(errList, err.Error())
			} else {
				samples = append(samples, ms(d))
			}
			mu.Unlock()
			return
		}
	})
	return samples, errList
}

// scaleRounds waits for k reaper rounds that saw at least n sandboxes and
// returns their cost as the server reports it.
func (r *Runner) scaleRounds(ctx context.Context, n, k int, after time.Time) ([]roundSample, error) {
	first, err := r.roundMetrics(ctx)
	if err != nil {
		return nil, err
	}
	last := first.rounds
	var out []roundSample
	// The default interval is 10 s; a round at 1,000 takes a few more.
	deadline := time.Now().Add(time.Duration(k)*30*time.Second + 30*time.Second)
	for len(out) < k && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		m, err := r.roundMetrics(ctx)
		if err != nil {
			return out, err
		}
		if m.rounds == last {
			continue
		}
		last = m.rounds
		if m.sandboxes >= n && m.start >= float64(after.UnixMilli())/1000 {
			out = append(out, roundSample{meter: m.meter * 1000, reap: m.reap * 1000, wall: m.wall * 1000})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no reaper round with every sandbox completed in time (berth_reaper_round_* missing on this server?)")
	}
	return out, nil
}

type roundMetric struct {
	rounds            float64
	sandboxes         int
	meter, reap, wall float64 // seconds
	start             float64 // Unix seconds
}

// roundMetrics reads the berth_reaper_round_* families from /metrics.
func (r *Runner) roundMetrics(ctx context.Context) (roundMetric, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.c.Base+"/metrics", nil)
	if err != nil {
		return roundMetric{}, err
	}
	req.Header.Set("Authorization", "Bearer "+r.c.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return roundMetric{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return roundMetric{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var m roundMetric
	seen := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "berth_reaper_round") {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "berth_reaper_rounds_total":
			m.rounds, seen = v, true
		case "berth_reaper_round_sandboxes":
			m.sandboxes = int(v)
		case "berth_reaper_round_seconds":
			m.wall = v
		case "berth_reaper_round_start_seconds":
			m.start = v
		case `berth_reaper_round_cpu_seconds{phase="metering"}`:
			m.meter = v
		case `berth_reaper_round_cpu_seconds{phase="reaping"}`:
			m.reap = v
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if !seen {
		return m, errors.New("the server's /metrics has no berth_reaper_rounds_total")
	}
	return m, nil
}

// scaleRestart restarts the server and times until every sandbox answers.
func (r *Runner) scaleRestart(ctx context.Context, srv *SelfServer, ids []string, st *scaleStep) {
	before, err := runcList(ctx, r.runcBin(), srv.DataDir)
	if err != nil {
		st.restartErr = append(st.restartErr, "runc list before: "+err.Error())
	}
	stop, spawned, err := srv.Restart(ctx)
	st.stop = stop
	if err != nil {
		st.restartErr = append(st.restartErr, err.Error())
		return
	}
	_, errList := r.scaleExecAll(ctx, ids, 2*time.Minute)
	st.restart = time.Since(spawned)
	st.restartErr = append(st.restartErr, errList...)
	after, err := runcList(ctx, r.runcBin(), srv.DataDir)
	if err != nil {
		st.restartErr = append(st.restartErr, "runc list after: "+err.Error())
		return
	}
	for _, id := range ids {
		switch pa, ok := after[id]; {
		case !ok:
			st.missing++
		case pa == before[id]:
			st.adopted++
		default:
			st.changed++
		}
	}
}

// runcList is `runc list` over the server's runc root: container id → PID.
func runcList(ctx context.Context, bin, dataDir string) (map[string]int, error) {
	out, err := exec.CommandContext(ctx, bin, "--root", filepath.Join(dataDir, "runtime", "runc"), "list", "--format", "json").Output()
	if err != nil {
		return nil, fmt.Errorf("runc list: %w", err)
	}
	var list []struct {
		ID  string `json:"id"`
		Pid int    `json:"pid"`
	}
	if s := strings.TrimSpace(string(out)); s != "" && s != "null" {
		if err := json.Unmarshal(out, &list); err != nil {
			return nil, fmt.Errorf("runc list: %w", err)
		}
	}
	m := make(map[string]int, len(list))
	for _, c := range list {
		m[c.ID] = c.Pid
	}
	return m, nil
}

// processRSSKiB is VmRSS of pid.
func processRSSKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("server RSS: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("server RSS: no VmRSS in /proc/%d/status", pid)
}

// parallel runs fn(0..n-1), at most k at a time.
func parallel(n, k int, fn func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, k)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}

// footprint is what berth's sandboxes hold on the host, counted so that a
// run can show it left nothing behind.
type footprint struct {
	mounts, loops, cgroups, veths int
}

// hostFootprint counts mounts and loop devices under dataDir, berth's
// cgroups of ids, and the veths on the server's bridge.
func hostFootprint(dataDir string, ids []string) footprint {
	var f footprint
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		f.mounts = strings.Count(string(b), dataDir+"/")
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil && strings.HasPrefix(string(b), dataDir+"/") {
			f.loops++
		}
	}
	for _, id := range ids {
		for _, p := range []string{"/sys/fs/cgroup/memory/berth/" + id, "/sys/fs/cgroup/berth/" + id} {
			if _, err := os.Stat(p); err == nil {
				f.cgroups++
				break
			}
		}
	}
	// The server's own veths: the ports of its bridge (a server on a
	// non-default data dir derives its bridge and veth names).
	if l, ok, _ := network.SavedLayout(filepath.Join(dataDir, "network")); ok {
		ports, _ := os.ReadDir(filepath.Join("/sys/class/net", l.Bridge, "brif"))
		f.veths = len(ports)
	}
	return f
}

// minus says what f has more of than before; "" when nothing.
func (f footprint) minus(before footprint) string {
	var parts []string
	for _, x := range []struct {
		what string
		n    int
	}{{"mounts", f.mounts - before.mounts}, {"loop devices", f.loops - before.loops},
		{"cgroups", f.cgroups - before.cgroups}, {"veths", f.veths - before.veths}} {
		if x.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", x.n, x.what))
		}
	}
	return strings.Join(parts, ", ")
}

// scaleMetrics turns the steps into rows, figure by figure, so that the
// table reads as a curve: scale-ls-cli@10, @100, @1000, then the next figure.
func scaleMetrics(rt string, steps []scaleStep, create0, raw0 []float64, rss0 int64) []Metric {
	def := func(s string) string {
		return strings.NewReplacer("SCALEPAR", strconv.Itoa(scaleParallel), "SCALECR", strconv.Itoa(scaleCreateRuns)).Replace(s)
	}
	row := func(fig string, n int, unit, definition string) Metric {
		return Metric{Name: fmt.Sprintf("scale-%s@%d", fig, n), Runtime: rt, Unit: unit, Definition: def(definition),
			Available: true, Samples: []float64{}, Derived: map[string]float64{}}
	}
	var exec, lsCLI, lsREST, create, rss, round, restart []Metric
	p50of0 := Percentile(create0, 50)
	for _, s := range steps {
		m := row("exec", s.n, "ms", defScaleExec)
		m.Samples, m.Errors = s.exec, append(slices.Clone(s.createErr), s.execErr...)
		m.Derived["answered"], m.Derived["n"] = float64(s.answered), float64(s.n)
		m.Derived["create_wall_s"] = s.createWall.Seconds()
		m.Notes = "goal: all answer"
		exec = append(exec, m)

		m = row("ls-cli", s.n, "ms", defScaleLsCLI)
		m.Samples, m.Errors = s.lsCLI, s.lsCLIErr
		m.Baseline = baseline("runc list", "see scale-ls-cli", s.runcList, s.rlErr)
		m.Notes = "goal: p50 ≤ 50 ms at 1,000"
		lsCLI = append(lsCLI, m)

		m = row("ls-rest", s.n, "ms", defScaleLsREST)
		m.Samples, m.Errors = s.lsREST, s.lsRESTErr
		lsREST = append(lsREST, m)

		m = row("create", s.n, "ms", defScaleCreate)
		m.Samples, m.Errors = s.create, s.createErrs
		if p := Percentile(s.create, 50); p50of0 > 0 && len(s.create) > 0 {
			m.Derived["ratio_vs_0"] = p / p50of0
		}
		m.Derived["p50_at_0"] = p50of0
		m.Baseline = baseline(rt+" run, same step", def(strings.ReplaceAll(defScaleRaw, "RT", rt)), s.raw, s.rawErrs)
		if p, p0 := Percentile(s.raw, 50), Percentile(raw0, 50); len(s.raw) > 0 && len(raw0) > 0 && p0 > 0 {
			m.Derived["raw_p50_at_0"], m.Derived["raw_ratio_vs_0"] = p0, p/p0
		}
		m.Notes = "goal: ratio_vs_0 ≤ 1.2"
		create = append(create, m)

		m = row("rss", s.n, "KiB", defScaleRSS)
		if s.rssErr != nil {
			m = notAvailable(m.Name, rt, m.Unit, m.Definition, s.rssErr.Error())
		} else {
			m.Samples = []float64{s.rssKiB}
			m.Derived["rss0_mib"] = float64(rss0) / 1024
		}
		m.Notes = "goal: ≤ 1024 KiB per sandbox"
		rss = append(rss, m)

		m = row("round-cpu", s.n, "ms", defScaleRound)
		if s.roundErr != nil && len(s.rounds) == 0 {
			m = notAvailable(m.Name, rt, m.Unit, m.Definition, s.roundErr.Error())
		}
		var meter, reap, wall []float64
		for _, x := range s.rounds {
			m.Samples = append(m.Samples, x.meter+x.reap)
			meter, reap, wall = append(meter, x.meter), append(reap, x.reap), append(wall, x.wall)
		}
		if len(s.rounds) > 0 {
			m.Derived = map[string]float64{"metering_ms": Percentile(meter, 50), "reaping_ms": Percentile(reap, 50), "wall_ms": Percentile(wall, 50)}
		}
		m.Notes = "goal: ≤ 1000 ms of CPU"
		round = append(round, m)

		m = row("restart", s.n, "ms", defScaleRestart)
		if s.restart > 0 {
			m.Samples = []float64{ms(s.restart)}
		}
		m.Errors = s.restartErr
		m.Derived["stop_ms"], m.Derived["adopted"] = ms(s.stop), float64(s.adopted)
		if s.changed > 0 || s.missing > 0 {
			m.Derived["new_pid"], m.Derived["missing"] = float64(s.changed), float64(s.missing)
		}
		m.Notes = "goal: all re-adopted in ≤ 10 s"
		restart = append(restart, m)
	}
	var out []Metric
	for _, g := range [][]Metric{exec, lsCLI, lsREST, create, rss, round, restart} {
		out = append(out, g...)
	}
	return out
}
