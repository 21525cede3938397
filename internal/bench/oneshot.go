package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/rootfs"
)

// The one-shot rows (issue 14): what a user pays for one command in a
// fresh isolated machine through the CLI, against the peer a user would
// pick instead (podman, on the same busybox rootfs), and what one CLI
// call costs before and after the server's own answer.

const (
	defOneshot = "One sample is three whole `berth` processes run one after the other, as a shell script would: `berth create --template T --runtime RT` (prints the id), `berth exec ID -- echo ok` (prints ok), `berth rm -f ID`; the clock starts when the first is spawned and stops when the last has exited. create_p50, exec_p50, rm_p50: each process's own p50. Samples are taken pair by pair with the baseline (berth first on even samples, podman first on odd ones)."
	defPodman  = "`podman [--runtime RUNSC] run --rm --network none IMAGE echo ok` as a whole process, IMAGE being the same busybox rootfs the tiny template is built from (`podman import`ed outside the clock), with CONTAINERS_CONF set to a containers.conf holding `default_ulimits = []` (this kind of host refuses podman's default rlimits); runsc rows pass the runsc binary the bench found with --runtime."
	defCLICall = "`berth ls` as a whole process (spawn to exit, BERTH_URL and BERTH_API_KEY in its environment) against the same server. Baseline: the same GET /v1/sandboxes sent from the already-running bench process over a new TCP connection (what the server and the loopback cost), the clock stopping when the decoded answer is back. overhead_ms = p50 − baseline p50: the CLI's own cost per call (process start, init, client set-up, output)."
)

// PodmanImage is the podman image name the one-shot baseline imports
// (tagged with the run's label, removed at the end of the run).
const PodmanImage = "localhost/berth-bench-tiny"

// podmanEnv is podman's environment for the baseline: containers.conf
// with no default rlimits, in the bench's temporary directory only.
type podmanEnv struct {
	bin, image, dir string
	env             []string
}

// podman imports the tiny rootfs into podman once per run; the error
// says why the baseline is not available (e.g. podman not installed).
func (r *Runner) podman(ctx context.Context) (*podmanEnv, error) {
	r.podmanOnce.Do(func() { r.pod, r.podErr = newPodmanEnv(ctx, r.label) })
	return r.pod, r.podErr
}

func newPodmanEnv(ctx context.Context, label string) (*podmanEnv, error) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		return nil, errors.New("podman is not installed")
	}
	dir, err := os.MkdirTemp("", "berth-bench-podman-")
	if err != nil {
		return nil, err
	}
	p := &podmanEnv{bin: bin, image: PodmanImage + ":" + label, dir: dir}
	conf := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		p.close()
		return nil, err
	}
	p.env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		p.close()
		return nil, fmt.Errorf("busybox rootfs: %w", err)
	}
	tar := filepath.Join(dir, "tiny.tar")
	if out, err := exec.CommandContext(ctx, "tar", "-C", root, "--numeric-owner", "-cf", tar, ".").CombinedOutput(); err != nil {
		p.close()
		return nil, fmt.Errorf("tar: %v: %s", err, out)
	}
	if _, err := p.run(ctx, "import", tar, p.image); err != nil {
		p.close()
		return nil, fmt.Errorf("podman import: %w", err)
	}
	return p, nil
}

func (p *podmanEnv) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = p.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("podman %s: %v: %s", strings.Join(args, " "), err, tailString(strings.TrimSpace(errOut.String()), 300))
	}
	return out.String(), nil
}

// close removes the image and the temporary directory.
func (p *podmanEnv) close() {
	if p == nil {
		return
	}
	if p.env != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, _ = p.run(ctx, "rmi", "-f", p.image)
		cancel()
	}
	os.RemoveAll(p.dir)
}

// cli runs one berth CLI process against the bench's server and returns its stdout.
func (r *Runner) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, r.o.BerthBin, args...)
	cmd.Env = append(os.Environ(), "BERTH_URL="+r.c.Base, "BERTH_API_KEY="+r.c.Key)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("berth %s: %v: %s", args[0], err, tailString(strings.TrimSpace(errOut.String()), 300))
	}
	return out.String(), nil
}

// oneshotBerth is one berth cycle; phases are the three processes' durations.
func (r *Runner) oneshotBerth(ctx context.Context, rt string) (total time.Duration, phases [3]time.Duration, err error) {
	start := time.Now()
	out, err := r.cli(ctx, "create", "--template", r.o.Template, "--runtime", rt, "--ttl", "30m", "--label", "berth-bench="+r.label)
	phases[0] = time.Since(start)
	if err != nil {
		return 0, phases, err
	}
	id := strings.TrimSpace(out)
	t := time.Now()
	out, err = r.cli(ctx, "exec", id, "--", "echo", "ok")
	phases[1] = time.Since(t)
	if err == nil && out != "ok\n" {
		err = fmt.Errorf("berth exec: echo ok printed %q", tailString(out, 100))
	}
	if err != nil {
		r.remove(ctx, id)
		return 0, phases, err
	}
	t = time.Now()
	if _, err := r.cli(ctx, "rm", "-f", id); err != nil {
		r.remove(ctx, id)
		return 0, phases, err
	}
	phases[2] = time.Since(t)
	return time.Since(start), phases, nil
}

func (r *Runner) oneshotPodman(ctx context.Context, p *podmanEnv, runtimeArgs []string) (time.Duration, error) {
	args := append(append([]string{}, runtimeArgs...), "run", "--rm", "--network", "none", p.image, "echo", "ok")
	start := time.Now()
	out, err := p.run(ctx, args...)
	d := time.Since(start)
	if err == nil && out != "ok\n" {
		err = fmt.Errorf("podman run: echo ok printed %q", tailString(out, 100))
	}
	return d, err
}

// oneshot measures the berth CLI cycle and podman's, pair by pair.
func (r *Runner) oneshot(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "oneshot", Runtime: rt, Unit: "ms", Definition: defOneshot, Available: true}
	if r.o.BerthBin == "" {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "no berth binary to run (Options.BerthBin)")}
	}
	bname := "podman run"
	var runtimeArgs []string
	p, perr := r.podman(ctx)
	if perr == nil && rt == "runsc" {
		bname = "podman --runtime runsc run"
		if r.o.RuntimeBins["runsc"] == "" {
			perr = errors.New("no runsc binary for podman --runtime")
		}
		runtimeArgs = []string{"--runtime", r.o.RuntimeBins["runsc"]}
	}
	var phase [3][]float64
	var baseSamples []float64
	var baseErr []string
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		measured := i >= r.o.Warmups
		berthRun := func() {
			d, ph, err := r.oneshotBerth(ctx, rt)
			switch {
			case err != nil:
				m.Errors = append(m.Errors, err.Error())
			case measured:
				m.Samples = append(m.Samples, ms(d))
				for k := range ph {
					phase[k] = append(phase[k], ms(ph[k]))
				}
			}
		}
		podmanRun := func() {
			if perr != nil {
				return
			}
			d, err := r.oneshotPodman(ctx, p, runtimeArgs)
			switch {
			case err != nil:
				baseErr = append(baseErr, err.Error())
			case measured:
				baseSamples = append(baseSamples, ms(d))
			}
		}
		// Alternate who goes first, so that neither always runs on a
		// host the other has just warmed (page cache, freed loop devices).
		if i%2 == 0 {
			berthRun()
			podmanRun()
		} else {
			podmanRun()
			berthRun()
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	if perr != nil {
		m.Baseline = unavailableBaseline(bname, defPodman, perr)
		m.Notes = "baseline " + bname + ": not available: " + perr.Error()
	} else {
		m.Baseline = baseline(bname, defPodman, baseSamples, baseErr)
	}
	if len(m.Samples) > 0 {
		m.Derived = map[string]float64{
			"create_p50": Percentile(phase[0], 50), "exec_p50": Percentile(phase[1], 50), "rm_p50": Percentile(phase[2], 50),
		}
	}
	return []Metric{m}
}

// cliCall measures one `berth ls` process against the same request sent
// from a warm process.
func (r *Runner) cliCall(ctx context.Context) Metric {
	m := Metric{Name: "cli-call", Unit: "ms", Definition: defCLICall, Available: true}
	if r.o.BerthBin == "" {
		return notAvailable(m.Name, "", m.Unit, m.Definition, "no berth binary to run (Options.BerthBin)")
	}
	// More samples than the default runs: a process start is a few ms and
	// its spread is the host's scheduler; pairs alternate as in oneshot.
	n := max(r.o.Runs, 50)
	var base []float64
	var baseErr []string
	direct := func() (time.Duration, error) {
		// A new transport per request: a fresh connection, as the CLI makes.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		c := client.New(r.c.Base, r.c.Key, client.WithHTTPClient(&http.Client{Transport: tr}))
		start := time.Now()
		_, err := c.List(ctx, client.ListOptions{})
		return time.Since(start), err
	}
	proc := func() (time.Duration, error) {
		start := time.Now()
		_, err := r.cli(ctx, "ls")
		return time.Since(start), err
	}
	for i := 0; i < r.o.Warmups+n && ctx.Err() == nil; i++ {
		measured := i >= r.o.Warmups
		d, err := proc()
		switch {
		case err != nil:
			m.Errors = append(m.Errors, err.Error())
		case measured:
			m.Samples = append(m.Samples, ms(d))
		}
		d, err = direct()
		switch {
		case err != nil:
			baseErr = append(baseErr, err.Error())
		case measured:
			base = append(base, ms(d))
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	m.Baseline = baseline("GET /v1/sandboxes, warm process", "", base, baseErr)
	m.Baseline.Definition = "see cli-call"
	if len(m.Samples) > 0 && len(base) > 0 {
		m.Derived = map[string]float64{"overhead_ms": Percentile(m.Samples, 50) - Percentile(base, 50)}
	}
	return m
}
