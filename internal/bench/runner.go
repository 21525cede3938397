package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// Options are `berth bench`'s flags.
type Options struct {
	Only     []string // metric names; empty = all
	Runs     int      // measured samples per metric
	Warmups  int      // unmeasured runs first
	Runtimes []string // runc, runsc
	Template string
	Burst    int    // concurrent creates in burst; 0 = 100, or 4×Runs when Runs < 25
	E2BDir   string // directory holding node_modules/e2b; "" = look for test/e2b
	// E2BTemplate is the template the E2B SDK creates from; it needs
	// /bin/bash (the SDK runs commands with `bash -l -c`).
	E2BTemplate string
	Command     string
	Self        bool
	// BerthBin is the berth CLI the one-shot and cli-call rows run as
	// whole processes; "" makes them not available.
	BerthBin string
	// RuntimeBins are the runtime binaries found on the host (RuntimeBinaries):
	// the one-shot baseline hands runsc's to podman --runtime.
	RuntimeBins map[string]string
	// Upstream is the TLS test service of the effects-https row (--self
	// starts it with the server); nil, with UpstreamErr saying why when
	// it failed, makes the row not available.
	Upstream    *HTTPSUpstream
	UpstreamErr error
	Log         io.Writer // progress
	// Server is the server --self started (nil otherwise): the scale row
	// restarts it and reads its RSS.
	Server *SelfServer
	// ScaleSteps are the scale row's sandbox counts (default DefaultScaleSteps).
	ScaleSteps []int
	// ScaleRounds is how many reaper rounds each scale step waits for
	// (0 = 2); a round comes every 10 s on a default server.
	ScaleRounds int
}

// Names are every metric, in measuring order.
var Names = []string{"create-cold", "create-warm", "exec-rtt", "delete", "throughput", "burst", "density",
	"upload", "download", "fork", "diff", "pause-memory", "resume-memory", "pause-freeze", "resume-freeze", "merge", "e2b-tti", "e2b-tti-warm",
	"code-interpreter-tti", "code-interpreter-tti-warm", "code-interpreter-rtt",
	"activity-follow", "checkpoint-files", "rewind-files", "task-step", "resume-tasks", "note-write", "audit-visible", "audit-verify", "self-api-rtt", "pause-resume-leases", "effects-https", "oneshot", "cli-call", "scale"}

// fileRows are the upload and download rows --only may also name one by
// one: the group measures ~1 min of 1000-request rows one may not want.
var fileRows = []string{"upload-64MiB", "upload-1000x4KiB", "download-64MiB", "download-1000x4KiB",
	"upload-1000x4KiB-batch", "download-1000x4KiB-batch"}

// optIn are metrics measured only when --only names them (they take minutes).
var optIn = []string{"scale"}

// Runner measures against one server.
type Runner struct {
	c     *Client
	o     Options
	raw   *Raw
	rawEr error
	info  wire.Info
	label string // every sandbox the run creates carries berth-bench=<label>
	out   []Metric

	podmanOnce sync.Once // oneshot.go: the podman baseline's image, imported once
	pod        *podmanEnv
	podErr     error
}

// NewRunner checks the options against the server. raw may be nil, with
// rawErr saying why the baselines that need it are not available.
func NewRunner(c *Client, o Options, raw *Raw, rawErr error) (*Runner, error) {
	if o.Runs < 1 {
		return nil, fmt.Errorf("--runs must be at least 1")
	}
	for _, n := range o.Only {
		if !slices.Contains(Names, n) && !slices.Contains(fileRows, n) {
			return nil, fmt.Errorf("--only: unknown metric %q (allowed: %s)", n, strings.Join(Names, ", "))
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return &Runner{c: c, o: o, raw: raw, rawEr: rawErr, label: newID("r")}, nil
}

// want reports whether a metric was selected; "upload" and "download"
// select both of their sizes.
func (r *Runner) want(name string) bool {
	group, _, _ := strings.Cut(name, "-")
	if group != "upload" && group != "download" {
		group = name
	}
	if len(r.o.Only) == 0 {
		return !slices.Contains(optIn, name)
	}
	if name == "upload" || name == "download" {
		// The group runs when one of its rows is named.
		return slices.ContainsFunc(r.o.Only, func(n string) bool { return n == name || strings.HasPrefix(n, name+"-") })
	}
	return slices.Contains(r.o.Only, name) || slices.Contains(r.o.Only, group)
}

func (r *Runner) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// Run measures the selected metrics and returns the report.
func (r *Runner) Run(ctx context.Context) (*Report, error) {
	started := time.Now().UTC()
	info, err := r.c.Info(ctx)
	if err != nil {
		return nil, err
	}
	r.info = info
	have := map[string]bool{}
	for _, rt := range info.Runtimes {
		have[rt.Name] = true
	}
	for _, rt := range r.o.Runtimes {
		if !have[rt] {
			return nil, fmt.Errorf("--runtime: the server has no %s runtime", rt)
		}
	}
	defer r.cleanup()
	defer func() { r.pod.close() }()
	perRuntime := []struct {
		names []string
		run   func(ctx context.Context, rt string) []Metric
	}{
		{[]string{"create-cold"}, r.createCold},
		{[]string{"create-warm"}, r.createWarm},
		{[]string{"exec-rtt"}, r.execRTT},
		{[]string{"delete"}, r.deleteRunning},
		{[]string{"throughput"}, r.throughput},
		{[]string{"burst"}, r.burst},
		{[]string{"density"}, r.density},
		{[]string{"upload", "download"}, r.fileIO},
		{[]string{"fork"}, r.fork},
		{[]string{"diff"}, r.diff},
		{[]string{"pause-memory", "resume-memory"}, r.memoryPause},
		{[]string{"pause-freeze", "resume-freeze"}, r.freezePause},
		{[]string{"activity-follow"}, r.activityFollow},
		{[]string{"merge"}, r.merge},                      // merge.go
		{[]string{"checkpoint-files"}, r.checkpointFiles}, // timeline.go
		{[]string{"rewind-files"}, r.rewindFiles},
		{[]string{"task-step"}, r.taskStep}, // tasks.go
		{[]string{"resume-tasks"}, r.taskResume},
		{[]string{"note-write"}, r.noteWrite},           // notes.go
		{[]string{"audit-visible"}, r.auditVisible},     // audit.go
		{[]string{"self-api-rtt"}, r.selfAPIRTT},        // selfapi.go
		{[]string{"pause-resume-leases"}, r.leasePause}, // leases.go
		{[]string{"effects-https"}, r.effectsHTTPS},     // effects_linux.go
		{[]string{"oneshot"}, r.oneshot},                // oneshot.go
		{[]string{"scale"}, r.scale},                    // scale.go
	}
	for _, g := range perRuntime {
		if !slices.ContainsFunc(g.names, r.want) {
			continue
		}
		for _, rt := range r.o.Runtimes {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.logf("measuring %s on %s", strings.Join(g.names, ", "), rt)
			// A group is measured together (e.g. pause and resume of the
			// same sandbox), so all of its metrics are reported.
			for _, m := range g.run(ctx, rt) {
				m.Finish()
				r.out = append(r.out, m)
			}
		}
	}
	if r.want("e2b-tti") {
		r.logf("measuring e2b-tti")
		m := r.e2bTTI(ctx)
		m.Finish()
		r.out = append(r.out, m)
	}
	if r.want("e2b-tti-warm") {
		r.logf("measuring e2b-tti-warm")
		m := r.e2bTTIWarm(ctx)
		m.Finish()
		r.out = append(r.out, m)
	}
	for _, ci := range []struct {
		name string
		run  func(context.Context) Metric
	}{{"code-interpreter-tti", r.ciTTI}, {"code-interpreter-tti-warm", r.ciTTIWarm}, {"code-interpreter-rtt", r.ciRTT},
		{"audit-verify", r.auditVerify}, {"cli-call", r.cliCall}} { // codeinterp.go, audit.go, oneshot.go
		if r.want(ci.name) {
			r.logf("measuring %s", ci.name)
			m := ci.run(ctx)
			m.Finish()
			r.out = append(r.out, m)
		}
	}
	return &Report{
		Schema: Schema, StartedAt: started, Command: r.o.Command, Machine: MachineInfo(),
		Server: Server{URL: r.c.Base, Version: info.Version, Self: r.o.Self, Template: r.o.Template, Runtimes: r.o.Runtimes},
		Runs:   r.o.Runs, Warmups: r.o.Warmups, Metrics: r.out,
	}, nil
}

// create makes a bench sandbox: labelled for cleanup, with a TTL so that
// an interrupted run leaves nothing behind for long.
func (r *Runner) create(ctx context.Context, rt string, mut ...func(*wire.CreateRequest)) (*wire.Sandbox, error) {
	req := wire.CreateRequest{Template: r.o.Template, Runtime: rt, TTL: "30m", Labels: map[string]string{"berth-bench": r.label}}
	for _, f := range mut {
		f(&req)
	}
	return r.c.Create(ctx, req)
}

// remove deletes a sandbox outside any clock, on a context that outlives ctx's cancellation.
func (r *Runner) remove(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := r.c.Delete(dctx, id); err != nil {
		r.logf("delete %s: %v", id, err)
	}
}

// cleanup deletes whatever this run left behind (e.g. after an error).
func (r *Runner) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Every page: a scale run leaves far more than one page's worth behind.
	all, err := r.c.ListAll(ctx, client.ListOptions{Labels: map[string]string{"berth-bench": r.label}})
	if err != nil {
		r.logf("cleanup: %v", err)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, sb := range all {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r.remove(ctx, sb.ID)
		}()
	}
	wg.Wait()
}

// measure runs fn Warmups+Runs times and keeps the last Runs durations (ms).
func (r *Runner) measure(ctx context.Context, fn func(ctx context.Context) (time.Duration, error)) (samples []float64, errList []string) {
	samples = []float64{}
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		d, err := fn(ctx)
		switch {
		case err != nil:
			errList = append(errList, err.Error())
		case i >= r.o.Warmups:
			samples = append(samples, ms(d))
		}
		if len(errList) > 3 && len(samples) == 0 {
			break
		}
	}
	return samples, errList
}

// baseline wraps measured baseline samples.
func baseline(name, def string, samples []float64, errList []string) *Baseline {
	return &Baseline{Name: name, Definition: def, Available: len(samples) > 0, Samples: samples, Errors: errList}
}

func unavailableBaseline(name, def string, err error) *Baseline {
	return &Baseline{Name: name, Definition: def, Reason: err.Error(), Samples: []float64{}}
}

func notAvailable(name, rt, unit, def, reason string) Metric {
	return Metric{Name: name, Runtime: rt, Unit: unit, Definition: def, Reason: reason, Samples: []float64{}}
}

// RuntimeBinaries finds runc, runsc and criu the way `berth serve` does:
// BERTH_RUNSC/BERTH_CRIU, beside the berth binary, the host cache, PATH.
func RuntimeBinaries(cacheDir string) (bins map[string]string, criu string) {
	self, _ := os.Executable()
	look := func(env string, cands ...string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		for _, c := range cands {
			if filepath.IsAbs(c) {
				if st, err := os.Stat(c); err == nil && !st.IsDir() {
					return c
				}
			} else if p, err := exec.LookPath(c); err == nil {
				return p
			}
		}
		return ""
	}
	bins = map[string]string{
		"runc":  look("BERTH_RUNC", "runc"),
		"runsc": look("BERTH_RUNSC", filepath.Join(filepath.Dir(self), "runsc"), filepath.Join(cacheDir, "bin", "runsc"), "runsc"),
	}
	return bins, look("BERTH_CRIU", filepath.Join(cacheDir, "bin", "criu"), "criu")
}
