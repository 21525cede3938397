package cli

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/client"
)

// runSnapshot: `berth snapshot ID [--name N]`, `berth snapshot ls`, `berth snapshot rm S...`.
func runSnapshot(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"snapshot: usage: berth snapshot ID [--name N] | snapshot ls [--json] | snapshot rm SNAPSHOT..."}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	switch args[0] {
	case "ls":
		fs := flag.NewFlagSet("snapshot ls", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "JSON output")
		own := fs.String("owner", "", "only this owner's snapshots (admin key only)")
		if _, err := parse(fs, args[1:]); err != nil {
			return err
		}
		list, err := c.Snapshots(e.ctx, *own)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, list)
		}
		tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSOURCE\tTEMPLATE\tRUNTIME\tLAYERS\tMEMORY\tOWNER\tCREATED")
		now := time.Now()
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%v\t%s\t%s ago\n", s.ID, s.Name, s.SourceSandbox, s.Template, s.Runtime,
				len(s.Layers), s.Memory, s.Owner, short(now.Sub(s.CreatedAt)))
		}
		return tw.Flush()
	case "rm":
		fs := flag.NewFlagSet("snapshot rm", flag.ContinueOnError)
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) == 0 {
			return usageError{"snapshot rm: expected at least one snapshot id"}
		}
		for _, id := range pos {
			if err := c.DeleteSnapshot(e.ctx, id); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, id)
		}
		return nil
	}
	fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
	name := fs.String("name", "", "a name for the snapshot (unique per owner)")
	asJSON := fs.Bool("json", false, "print the snapshot as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	id, err := one(fs, pos, "sandbox id")
	if err != nil {
		return err
	}
	sn, err := c.Sandbox(id).Snapshot(e.ctx, *name)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, sn)
	}
	fmt.Fprintln(e.stdout, sn.ID)
	return nil
}

// runFork: `berth fork ID [-n N] [--json]`.
func runFork(e *env, args []string) error {
	fs := flag.NewFlagSet("fork", flag.ContinueOnError)
	n := fs.Int("n", 1, "number of forks (1-100)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	res, err := c.Sandbox(id).Fork(e.ctx, *n)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, res)
	}
	msg := fmt.Sprintf("forked %s into %d sandbox(es) in %d ms, fork_mode %s (snapshot %s)", res.Parent, len(res.Sandboxes), res.Millis, res.Mode, res.Snapshot)
	if res.Reason != "" {
		msg += ": " + res.Reason
	}
	fmt.Fprintln(e.stderr, msg)
	for _, sb := range res.Sandboxes {
		fmt.Fprintln(e.stdout, sb.ID)
	}
	return nil
}

// templateFromSnapshot: `berth template from-snapshot SNAPSHOT NAME`.
func templateFromSnapshot(e *env, c *client.Client, args []string) error {
	fs := flag.NewFlagSet("template from-snapshot", flag.ContinueOnError)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{"template from-snapshot: usage: berth template from-snapshot SNAPSHOT NAME"}
	}
	t, err := c.PromoteSnapshot(e.ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s %s %s (%s)\n", t.Name, t.State, t.Fingerprint, strings.TrimSpace(t.Source))
	return nil
}
