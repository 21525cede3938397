//go:build linux

package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/errs"
)

// runBench measures every published number next to its baseline, against
// the server in BERTH_URL or, with --self, a server it starts and stops.
func runBench(e *env, args []string) error {
	if len(args) > 0 && args[0] == "https-client" {
		// Not for people: the effects-https row runs this binary inside a
		// sandbox as its HTTPS client.
		return bench.RunHTTPSClient(args[1:], e.stdout)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	only := fs.String("only", "", "comma-separated metrics: "+strings.Join(bench.Names, ","))
	runs := fs.Int("runs", 10, "measured samples per metric")
	warm := fs.Int("warmup", 1, "unmeasured runs before the samples")
	jsonOut := fs.String("json", "", "write the full report (raw samples, definitions, machine) to FILE")
	rtFlag := fs.String("runtime", "both", "runc, runsc or both (both = every runtime the server has)")
	tpl := fs.String("template", "tiny", "template the sandboxes are created from")
	self := fs.Bool("self", false, "start a berth serve of its own on a temporary data dir, with the busybox tiny template")
	md := fs.Bool("markdown", false, "print the README performance section instead of the table")
	from := fs.String("from", "", "do not measure: render a report written earlier with --json")
	burst := fs.Int("burst", 0, "concurrent creates in burst (default 100, or 4×runs when runs < 25)")
	scaleSteps := fs.String("scale-steps", "10,100,1000", "the scale row's steps: sandbox counts, ascending (needs --self and --only scale)")
	scaleRounds := fs.Int("scale-rounds", 2, "reaper rounds the scale row waits for at each step (one every 10 s)")
	e2bTpl := fs.String("e2b-template", "", "template the E2B SDK creates from; needs /bin/bash (default: \"default\" when the server has it)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "bench: --from")
		}
		var rep bench.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return errs.Field("from", "%s is not a bench report: %v", *from, err)
		}
		return render(e, &rep, *md)
	}
	if *runs < 1 || *warm < 0 {
		return usageError{"bench: --runs must be ≥ 1 and --warmup ≥ 0"}
	}
	var onlyList []string
	for _, n := range strings.Split(*only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			onlyList = append(onlyList, n)
		}
	}
	steps, err := parseSteps(*scaleSteps)
	if err != nil {
		return err
	}
	if *scaleRounds < 1 {
		return usageError{"bench: --scale-rounds must be at least 1"}
	}
	opts := bench.Options{ScaleSteps: steps, ScaleRounds: *scaleRounds, Only: onlyList, Runs: *runs, Warmups: *warm, Template: *tpl, Burst: *burst,
		E2BTemplate: *e2bTpl, Self: *self, Log: e.stderr, Command: "berth bench " + strings.Join(args, " ")}
	// The one-shot and cli-call rows run this very binary as the CLI.
	if exe, err := os.Executable(); err == nil {
		opts.BerthBin = exe
	}
	opts.RuntimeBins, _ = bench.RuntimeBinaries(defaultCacheDir)

	var c *bench.Client
	if *self {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		fmt.Fprintln(e.stderr, "starting berth serve with the tiny template ...")
		s, err := bench.StartSelf(e.ctx, exe, len(onlyList) == 0 || slices.Contains(onlyList, "effects-https"))
		if err != nil {
			return errs.Wrap(errs.Unavailable, err, "bench --self")
		}
		defer func() {
			if err := s.Stop(); err != nil {
				fmt.Fprintln(e.stderr, "berth: bench: stopping the server:", err)
			}
		}()
		c = bench.NewClient(s.URL, s.Key)
		opts.Upstream, opts.UpstreamErr = s.Upstream, s.UpstreamErr
		opts.Server = s
	} else {
		cl, err := newClient()
		if err != nil {
			return err
		}
		c = bench.NewClient(cl.URL(), cl.APIKey())
	}
	info, err := c.Info(e.ctx)
	if err != nil {
		return err
	}
	switch *rtFlag {
	case "runc", "runsc":
		opts.Runtimes = []string{*rtFlag}
	case "both":
		for _, r := range info.Runtimes {
			opts.Runtimes = append(opts.Runtimes, r.Name)
		}
	default:
		return usageError{"bench: --runtime must be runc, runsc or both, got " + *rtFlag}
	}
	wanted := func(n string) bool { return len(onlyList) == 0 || slices.Contains(onlyList, n) }
	if (wanted("e2b-tti") || wanted("e2b-tti-warm")) && opts.E2BTemplate == "" {
		opts.E2BTemplate = e2bTemplate(e, c, *self)
	}
	var raw *bench.Raw
	var rawErr error
	if wanted("create-cold") || wanted("delete") || wanted("burst") || wanted("pause-memory") || wanted("resume-memory") || wanted("scale") {
		bins, criu := bench.RuntimeBinaries(defaultCacheDir)
		if raw, rawErr = bench.NewRaw(bins, criu); raw != nil {
			defer raw.Close()
		}
	}
	r, err := bench.NewRunner(c, opts, raw, rawErr)
	if err != nil {
		return usageError{"bench: " + err.Error()}
	}
	rep, err := r.Run(e.ctx)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "bench: --json")
		}
	}
	return render(e, rep, *md)
}

// parseSteps reads --scale-steps: positive counts, ascending.
func parseSteps(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || (len(out) > 0 && n <= out[len(out)-1]) {
			return nil, usageError{"bench: --scale-steps must be positive sandbox counts in ascending order, e.g. 10,100,1000; got " + strconv.Quote(s)}
		}
		out = append(out, n)
	}
	return out, nil
}

func render(e *env, rep *bench.Report, md bool) error {
	if md {
		return bench.WriteMarkdown(e.stdout, rep)
	}
	return bench.WriteTable(e.stdout, rep)
}

// e2bTemplate picks a template with /bin/bash for the E2B SDK: the
// server's "default" template; for --self, the host's cached default
// rootfs is imported first. "" when there is none.
func e2bTemplate(e *env, c *bench.Client, self bool) string {
	if bench.TemplateReady(e.ctx, c, "default") {
		return "default"
	}
	if !self {
		return ""
	}
	cached, _ := filepath.Glob(filepath.Join(defaultCacheDir, "rootfs", "default-*.tar"))
	if len(cached) == 0 {
		return ""
	}
	fmt.Fprintf(e.stderr, "importing %s as template default for e2b-tti ...\n", cached[0])
	if err := bench.ImportTemplate(e.ctx, c, "default", cached[0]); err != nil {
		fmt.Fprintln(e.stderr, "berth: bench:", err)
		return ""
	}
	return "default"
}
