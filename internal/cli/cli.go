// Package cli implements berth's command-line verbs. Every verb but `serve`
// talks to a berth server only through its REST API.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Exit codes scripts can rely on. `berth exec` exits with the command's own code.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitNotFound = 3
	ExitConflict = 4
	ExitAuth     = 5
	ExitExec     = 125 // exec could not start the command
)

// env is what a verb gets to work with.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	serve  ServeFunc
}

// ServeFunc runs `berth serve`. The binary's composition root (cmd/berth)
// provides it, so this package does not link the server and builds for
// every GOOS.
type ServeFunc func(ctx context.Context, args []string, stderr io.Writer) error

// UsageError is a bad invocation: exit code 2, the message on stderr.
func UsageError(msg string) error { return usageError{msg} }

func runServe(e *env, args []string) error {
	if e.serve == nil {
		return errs.E(errs.NotImplemented, "berth serve is not part of this build")
	}
	return e.serve(e.ctx, args, e.stderr)
}

// RegisterDaemon adds a verb that, like serve, the composition root
// provides (`berth node`), so this package does not link it.
func RegisterDaemon(name, usage string, run ServeFunc) {
	register(name, usage, func(e *env, args []string) error { return run(e.ctx, args, e.stderr) })
}

type command struct {
	name  string
	usage string
	run   func(e *env, args []string) error
}

var commands []command

func register(name, usage string, run func(e *env, args []string) error) {
	commands = append(commands, command{name: name, usage: usage, run: run})
}

func init() {
	// The verb table is data, assembled in one place so `berth help` lists it.
	register("serve", "serve [--data-dir DIR] [--listen ADDR] [--config FILE] [--runtime runc|runsc] [--default-network P] [--upstream-ca FILE] [--no-userns] [--no-network] [--allow-private-egress CIDR]... [--egress-resolver ADDR:PORT] [--egress-max-conns N] [--egress-max-dns-inflight N] [--egress-dns-qps N] [--otlp-endpoint URL] [--activity-retention N] [--workspace-spares N] [--sandbox-domain D [--sandbox-tls-listen ADDR] [--sandbox-tls-cert F --sandbox-tls-key F]]   (Linux only; the config file takes every setting)", runServe)
	register("ca", caUsage, runCA)
	register("create", "create [--template T | --from-snapshot S] [--runtime R] [--ttl D] [--cpu N] [--memory MiB] [--disk MiB] [--pids N] [--label k=v]... [--env K=V]... [--expiry-action stop|delete|pause] [--workstation] [--auto-resume] [--idle-policy P|never] [--network deny-all|allow-all] [--allow RULE]... [--deny RULE]... [--secret NAME]... [--effectful HOST]... [--idempotency keep|derive] [--repeat replay|refuse] [--owner O] [--json]", runCreate)
	register("ls", "ls [--state S] [--label k=v]... [--owner O] [--json]", runList)
	register("inspect", "inspect ID", runInspect)
	register("exec", "exec [-i] [-t] [--env K=V]... [--cwd DIR] [--user U] [--timeout D] ID -- CMD...", runExec)
	register("cp", "cp [--user U] SRC DST   (either side may be ID:/path; - is stdin/stdout; a directory is copied as a tree in one batch)", runCp)
	register("stop", "stop ID", runStop)
	register("start", "start ID", runStart)
	register("rm", "rm [-f] ID...", runRm)
	register("extend", "extend ID --ttl D", runExtend)
	register("pause", "pause ID [--mode freeze|memory|disk]", runPause)
	register("resume", "resume ID", runResume)
	register("lease", "lease ID --for D   (0 releases)", runLease)
	register("events", "events [ID] [--json]", runEvents)
	register("activity", activityUsage, runActivity)
	register("audit", auditUsage, runAudit) // audit.go
	register("template", "template ls [--json] | template import NAME FILE.tar | template from-snapshot SNAPSHOT NAME | "+pullUsage+" | "+buildUsage+" | template rm NAME...", runTemplate)
	register("snapshot", "snapshot ID [--name N] [--json] | snapshot ls [--json] | snapshot rm SNAPSHOT...", runSnapshot)
	register("fork", "fork ID [-n N] [--json]", runFork)
	register("checkpoint", checkpointUsage, runCheckpoint) // timeline.go
	register("timeline", timelineUsage, runTimeline)
	register("rewind", rewindUsage, runRewind)
	register("promote", promoteUsage, runPromote)
	register("note", noteUsage, runNote)          // note.go: handoff notes
	register("effects", effectsUsage, runEffects) // effects.go
	register("diff", diffUsage, runDiff)
	register("compare", compareUsage, runCompare)
	register("merge", mergeUsage, runMerge)
	register("conflicts", conflictsUsage, runConflicts)
	register("resolve", resolveUsage, runResolve)
	register("task", taskUsage, runTask) // task.go
	register("pool", poolUsage, runPool)
	register("key", "key create --owner NAME", runKey)
	register("info", "info [--json]", runInfo)
	register("net", "net set ID [--network deny-all|allow-all] [--allow RULE]... [--deny RULE]... [--effectful HOST]... [--idempotency keep|derive] [--repeat replay|refuse] | net show ID [--json] | net log ID [--json] [--limit N]", runNet)
	register("secret", "secret set NAME --host HOST [--header 'Authorization: Bearer {{value}}'] < value | secret ls [--json] | secret rm NAME | secret leases [ID] [--json] | secret revoke LEASE", runSecret)
	register("port", "port ID PORT [--token] [--close] | port ID   (expose a sandbox port through berth's HTTP proxy)", runPort)
	register("usage", "usage [--owner O] [--since T] [--sandbox ID] [--sandboxes] [--json]", runUsage)
	register("report", "report orphans [--days N] [--owner O] [--json]", runReport)
	register("cost", costUsage, runCost)
	register("cleanup", cleanupUsage, runCleanup)
	register("builds", buildsUsage, runBuilds)
	register("quota", "quota set OWNER [--sandboxes N] [--cpu N] [--memory MiB] [--disk MiB] [--snapshots N] | get OWNER | ls | rm OWNER", runQuota)
	register("bench", benchUsage, runBench)
	register("sim", simUsage, runSim)
	register("completion", completionUsage, runCompletion)
}

// Main runs one CLI invocation and returns the process exit code; serve is
// `berth serve` (nil: not in this build).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, serve ServeFunc) int {
	if len(args) == 0 || (args[0] == "help" && len(args) == 1) || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return ExitOK
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "berth", Version)
		return ExitOK
	}
	if len(args) == 2 && args[0] == "help" {
		args = []string{args[1], "--help"}
	}
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, serve: serve}
	for _, c := range commands {
		if c.name == args[0] {
			if wantsHelp(args[1:]) {
				fmt.Fprintf(stdout, "Usage: berth %s\n", c.usage)
				return ExitOK
			}
			err := c.run(e, args[1:])
			return exitCode(stderr, err)
		}
	}
	fmt.Fprintf(stderr, "berth: unknown command %q\n\n", args[0])
	usage(stderr)
	return ExitUsage
}

// wantsHelp: -h, -help or --help among a verb's own arguments (not after
// "--", where they belong to the command `berth exec` runs).
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// Version is set at build time.
var Version = "dev"

func usage(w io.Writer) {
	fmt.Fprintln(w, "berth — sandboxes for AI agents\n\nUsage:")
	names := make([]string, 0, len(commands))
	byName := map[string]string{}
	for _, c := range commands {
		names = append(names, c.name)
		byName[c.name] = c.usage
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  berth %s\n", byName[n])
	}
	fmt.Fprintln(w, "\nEnvironment: BERTH_URL (default http://127.0.0.1:7070), BERTH_API_KEY (default: DATA_DIR/admin.key when local)")
}

// exitStatus carries a specific exit code (e.g. the exec'd command's).
type exitStatus struct{ code int }

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	var es exitStatus
	if errors.As(err, &es) {
		return es.code
	}
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, flag.ErrHelp) {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "berth:", err)
		}
		return ExitUsage
	}
	fmt.Fprintln(stderr, "berth:", err)
	switch kindOf(err) {
	case errs.NotFound:
		return ExitNotFound
	case errs.Conflict, errs.FailedPrecondition, errs.AlreadyExists:
		return ExitConflict
	case errs.Unauthenticated, errs.PermissionDenied:
		return ExitAuth
	case errs.InvalidArgument:
		return ExitUsage
	}
	return ExitError
}

// parse parses flags that may be interspersed with positional arguments;
// everything after "--" is positional and untouched.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var flags, pos, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = args[i+1:]
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			f := fs.Lookup(name)
			if f == nil {
				return nil, usageError{fmt.Sprintf("%s: unknown flag %s", fs.Name(), a)}
			}
			if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
				continue
			}
			if i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	if err := fs.Parse(flags); err != nil {
		return nil, usageError{fmt.Sprintf("%s: %v", fs.Name(), err)}
	}
	if rest != nil {
		pos = append(pos, "--")
		pos = append(pos, rest...)
	}
	return pos, nil
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func kvs(field string, list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, s := range list {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, errs.Field(field, "must be key=value, got %q", s)
		}
		out[k] = v
	}
	return out, nil
}
