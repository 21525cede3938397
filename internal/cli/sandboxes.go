package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseIDClient parses a verb's flags and its one sandbox id, and connects.
func parseIDClient(fs *flag.FlagSet, args []string) (string, *client.Client, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return "", nil, err
	}
	id, err := one(fs, pos, "sandbox id")
	if err != nil {
		return "", nil, err
	}
	c, err := newClient()
	return id, c, err
}

func one(fs *flag.FlagSet, pos []string, what string) (string, error) {
	if len(pos) != 1 {
		return "", usageError{fmt.Sprintf("%s: expected exactly one %s", fs.Name(), what)}
	}
	return pos[0], nil
}

func runCreate(e *env, args []string) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	var req wire.CreateRequest
	var labels, envs multi
	fs.StringVar(&req.Template, "template", "", "template name (default: the server's default)")
	fs.StringVar(&req.Runtime, "runtime", "", "runc or runsc (default: the server's default)")
	fs.StringVar(&req.TTL, "ttl", "", "time to live, e.g. 15m, 2h, 1d")
	fs.StringVar(&req.ExpiryAction, "expiry-action", "", "stop, delete or pause at expiry")
	fs.Float64Var(&req.CPU, "cpu", 0, "CPU cores")
	fs.Int64Var(&req.MemoryMiB, "memory", 0, "memory limit in MiB")
	fs.Int64Var(&req.DiskMiB, "disk", 0, "workspace disk limit in MiB")
	fs.Int64Var(&req.Pids, "pids", 0, "max processes")
	fs.Var(&labels, "label", "label k=v (repeatable)")
	fs.Var(&envs, "env", "default env K=V for every process (repeatable)")
	fs.BoolVar(&req.Workstation, "workstation", false, "long-lived: pause instead of stop at expiry")
	fs.BoolVar(&req.AutoResume, "auto-resume", false, "resume on exec/files while paused")
	fs.StringVar(&req.Owner, "owner", "", "owner (admin key only)")
	allow, deny, mode := policyFlags(fs)
	effects := effectFlags(fs)
	var secrets multi
	fs.Var(&secrets, "secret", "grant secret NAME: env NAME holds a placeholder, the proxy injects the value (repeatable)")
	fs.StringVar(&req.LeaseTTL, "lease-ttl", "", "how long each lease of a granted secret lives, e.g. 30m (default: as long as the sandbox)")
	fs.StringVar(&req.ExpectedDuration, "expected-duration", "", "expected lifetime for cluster placement: a duration (45m) or short, interactive, long")
	fs.StringVar(&req.FromSnapshot, "from-snapshot", "", "start from this snapshot's files (berth snapshot ls)")
	fs.StringVar(&req.IdlePolicy, "idle-policy", "", "reaper idle policy name, or never (default: the template's or server's)")
	asJSON := fs.Bool("json", false, "print the sandbox as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError{"create: unexpected arguments " + strings.Join(pos, " ")}
	}
	if req.Labels, err = kvs("label", labels); err != nil {
		return err
	}
	if req.Env, err = kvs("env", envs); err != nil {
		return err
	}
	req.Network, req.Allow, req.Deny, req.Secrets, req.Effects = *mode, *allow, *deny, secrets, effects()
	c, err := newClient()
	if err != nil {
		return err
	}
	sb, err := c.Create(e.ctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, sb)
	}
	fmt.Fprintln(e.stdout, sb.ID)
	return nil
}

func runList(e *env, args []string) error {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	var labels, states multi
	fs.Var(&labels, "label", "filter by label k=v (repeatable)")
	fs.Var(&states, "state", "filter by state (repeatable or comma-separated)")
	own := fs.String("owner", "", "filter by owner (admin key only)")
	asJSON := fs.Bool("json", false, "JSON output")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	o := client.ListOptions{Owner: *own}
	var err2 error
	if o.Labels, err2 = kvs("label", labels); err2 != nil {
		return err2
	}
	for _, st := range states {
		for _, one := range strings.Split(st, ",") {
			if one != "" {
				o.States = append(o.States, wire.State(one))
			}
		}
	}
	all, err := c.ListAll(e.ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, all)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tRUNTIME\tOWNER\tCREATED\tEXPIRES\tLABELS")
	now := time.Now()
	for _, sb := range all {
		state := string(sb.State)
		if sb.State == wire.StatePaused && sb.PauseActual != "" {
			state += " (" + string(sb.PauseActual) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\t%s\t%s\n", sb.ID, state, sb.Template, sb.Runtime, sb.Owner,
			short(now.Sub(sb.CreatedAt)), until(now, sb.ExpiresAt), labelString(sb.Labels))
	}
	return tw.Flush()
}

func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func until(now, t time.Time) string {
	if !t.After(now) {
		return "expired"
	}
	return "in " + short(t.Sub(now))
}

func labelString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func runInspect(e *env, args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	sb, err := c.Sandbox(id).Get(e.ctx)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, sb)
}

// simple runs a verb of the form `berth VERB ID` that answers the sandbox;
// setup registers the verb's flags and returns the call to make.
func simple(e *env, name string, args []string, setup func(fs *flag.FlagSet) func(context.Context, *client.Sandbox) (*wire.Sandbox, error)) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	do := setup(fs)
	asJSON := fs.Bool("json", false, "print the sandbox as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	id, err := one(fs, pos, "sandbox id")
	if err != nil {
		return err
	}
	if _, err := do(e.ctx, nil); err != nil { // flag checks only: a nil handle is not called
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	sb, err := do(e.ctx, c.Sandbox(id))
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, sb)
	}
	msg := fmt.Sprintf("%s %s", sb.ID, sb.State)
	if sb.State == wire.StatePaused {
		msg += " (mode " + string(sb.PauseActual) + ")"
		if sb.PauseRequested != "" && sb.PauseRequested != sb.PauseActual {
			msg += fmt.Sprintf(" — requested %s: %s", sb.PauseRequested, sb.Message)
		}
	}
	if name == "resume" && sb.ResumedFrom != "" {
		msg += " (resumed from " + string(sb.ResumedFrom) + ")"
	}
	if name == "extend" || name == "lease" {
		msg += ", expires " + sb.ExpiresAt.Local().Format(time.RFC3339)
	}
	fmt.Fprintln(e.stdout, msg)
	return nil
}

// sandboxCall makes a verb's call; given a nil handle it only checks the
// verb's flags (before a client is made) and answers nil, nil.
type sandboxCall = func(context.Context, *client.Sandbox) (*wire.Sandbox, error)

func noFlags(call func(*client.Sandbox, context.Context) (*wire.Sandbox, error)) func(*flag.FlagSet) sandboxCall {
	return func(*flag.FlagSet) sandboxCall {
		return func(ctx context.Context, s *client.Sandbox) (*wire.Sandbox, error) {
			if s == nil {
				return nil, nil
			}
			return call(s, ctx)
		}
	}
}

func runStop(e *env, args []string) error {
	return simple(e, "stop", args, noFlags((*client.Sandbox).Stop))
}
func runStart(e *env, args []string) error {
	return simple(e, "start", args, noFlags((*client.Sandbox).Start))
}
func runResume(e *env, args []string) error {
	return simple(e, "resume", args, noFlags((*client.Sandbox).Resume))
}

func runPause(e *env, args []string) error {
	return simple(e, "pause", args, func(fs *flag.FlagSet) sandboxCall {
		mode := fs.String("mode", "", "freeze, memory or disk (default: memory when the runtime can, else disk)")
		return func(ctx context.Context, s *client.Sandbox) (*wire.Sandbox, error) {
			if s == nil {
				return nil, nil
			}
			return s.Pause(ctx, wire.PauseMode(*mode))
		}
	})
}

func runExtend(e *env, args []string) error {
	return simple(e, "extend", args, func(fs *flag.FlagSet) sandboxCall {
		ttl := fs.String("ttl", "", "new time to live from now, e.g. 30m")
		return func(ctx context.Context, s *client.Sandbox) (*wire.Sandbox, error) {
			if *ttl == "" {
				return nil, usageError{"extend: --ttl is required"}
			}
			if s == nil {
				return nil, nil
			}
			return s.Extend(ctx, *ttl)
		}
	})
}

func runLease(e *env, args []string) error {
	return simple(e, "lease", args, func(fs *flag.FlagSet) sandboxCall {
		d := fs.String("for", "", "how long the sandbox is busy, e.g. 30m (0 releases)")
		return func(ctx context.Context, s *client.Sandbox) (*wire.Sandbox, error) {
			if *d == "" {
				return nil, usageError{"lease: --for is required"}
			}
			if s == nil {
				return nil, nil
			}
			return s.Lease(ctx, *d)
		}
	})
}

func runRm(e *env, args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	force := fs.Bool("f", false, "do not fail on missing sandboxes")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError{"rm: expected at least one sandbox id"}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	var firstErr error
	for _, id := range pos {
		err := c.Sandbox(id).Delete(e.ctx)
		if err != nil && !(*force && isNotFound(err)) {
			fmt.Fprintf(e.stderr, "berth: rm %s: %v\n", id, err)
			if firstErr == nil {
				firstErr = exitStatus{exitCode(io.Discard, err)}
			}
			continue
		}
		fmt.Fprintln(e.stdout, id)
	}
	return firstErr
}
