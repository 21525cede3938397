package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
)

const (
	mergeUsage     = "merge CHILD --into PARENT [--strategy three-way|ours|theirs] [--path P]... [--json] | merge --continue PARENT | merge --abort PARENT"
	conflictsUsage = "conflicts PARENT [--json] | conflicts PARENT ID --show base|ours|theirs|merged"
	resolveUsage   = "resolve PARENT CONFLICT --ours|--theirs|--base|--file F [--mode 0644]"
)

// runMerge: `berth merge CHILD --into PARENT`, `--continue PARENT`, `--abort PARENT`.
func runMerge(e *env, args []string) error {
	fs := flag.NewFlagSet("merge", flag.ContinueOnError)
	into := fs.String("into", "", "the sandbox to merge into (the fork's parent)")
	strategy := fs.String("strategy", "", "three-way (default: conflicts are stored), ours or theirs")
	cont := fs.Bool("continue", false, "apply PARENT's open merge once its conflicts are resolved")
	abort := fs.Bool("abort", false, "drop PARENT's open merge")
	asJSON := fs.Bool("json", false, "print the merge as JSON")
	var paths multi
	fs.Var(&paths, "path", "merge only this path prefix or pattern (repeatable)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	var m wire.Merge
	switch {
	case *cont || *abort:
		if *cont && *abort {
			return usageError{"merge: --continue and --abort exclude each other"}
		}
		target, err := one(fs, pos, "sandbox id (the merge's target)")
		if err != nil {
			return err
		}
		open, ok, err := c.OpenMerge(e.ctx, target)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("merge: sandbox %s has no open merge", target)
		}
		if *cont {
			m, err = c.ContinueMerge(e.ctx, target, open.ID)
		} else {
			m, err = c.AbortMerge(e.ctx, target, open.ID)
		}
		if err != nil {
			return err
		}
	default:
		src, err := one(fs, pos, "sandbox id (the fork to merge)")
		if err != nil {
			return err
		}
		if *into == "" {
			return usageError{"merge: --into PARENT is required"}
		}
		if m, err = c.Merge(e.ctx, *into, wire.MergeRequest{Source: src, Strategy: *strategy, Paths: paths}); err != nil {
			return err
		}
	}
	if *asJSON {
		if err := printJSON(e.stdout, m); err != nil {
			return err
		}
	} else {
		printMerge(e.stdout, m)
	}
	if m.State == "conflicted" {
		return exitStatus{code: ExitConflict} // scripts: the merge waits for `berth resolve`
	}
	return nil
}

func printMerge(w io.Writer, m wire.Merge) {
	switch m.State {
	case "applied":
		fmt.Fprintf(w, "merge %s: %s into %s applied: %d write(s), %d delete(s) in %d ms\n", m.ID, m.Source, m.Target, m.Writes, m.Deletes, m.Ms)
		for _, f := range m.OpenFiles {
			fmt.Fprintf(w, "  open in pid %d (%s): %s\n", f.PID, f.Cmd, f.Path)
		}
	case "conflicted":
		fmt.Fprintf(w, "merge %s: %d conflict(s); see `berth conflicts %s`, then `berth resolve` each (the merge applies after the last)\n", m.ID, m.Conflicts, m.Target)
	default:
		fmt.Fprintf(w, "merge %s: %s %s\n", m.ID, m.State, m.Reason)
	}
}

// runConflicts: `berth conflicts PARENT [--json]`, `berth conflicts PARENT ID --show SIDE`.
func runConflicts(e *env, args []string) error {
	fs := flag.NewFlagSet("conflicts", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	show := fs.String("show", "", "print one version of conflict ID: base, ours, theirs or merged")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 || (len(pos) == 2) != (*show != "") {
		return usageError{"conflicts: usage: berth " + conflictsUsage}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	list, err := c.Conflicts(e.ctx, pos[0])
	if err != nil {
		return err
	}
	if len(pos) == 2 {
		for _, cf := range list {
			if cf.ID != pos[1] {
				continue
			}
			var v wire.ConflictVersion
			switch *show {
			case "base":
				v = cf.Base
			case "ours":
				v = cf.Ours
			case "theirs":
				v = cf.Theirs
			case "merged":
				_, err := e.stdout.Write(cf.Merged)
				return err
			default:
				return usageError{"conflicts: --show takes base, ours, theirs or merged"}
			}
			if v.Node == nil {
				return fmt.Errorf("conflicts: %s is absent on the %s side", cf.Path, *show)
			}
			if v.Text == nil && v.Node.Type == "file" {
				return fmt.Errorf("conflicts: %s on the %s side is not text (%d bytes, sha256 %s)", cf.Path, *show, v.Node.Size, v.Node.SHA256)
			}
			if v.Node.Type == "symlink" {
				_, err := fmt.Fprintln(e.stdout, v.Node.Target)
				return err
			}
			_, err := e.stdout.Write(v.Text)
			return err
		}
		return fmt.Errorf("conflicts: no conflict %s in the open merge of %s", pos[1], pos[0])
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPATH\tKIND\tBASE\tOURS\tTHEIRS\tMESSAGE")
	for _, cf := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cf.ID, cf.Path, cf.Kind, side(cf.Base), side(cf.Ours), side(cf.Theirs), cf.Message)
	}
	return tw.Flush()
}

func side(v wire.ConflictVersion) string {
	if v.Node == nil {
		return "-"
	}
	return fmt.Sprintf("%s %04o", v.Node.Type, v.Node.Mode)
}

// runResolve: `berth resolve PARENT CONFLICT --ours|--theirs|--base|--file F [--mode 0644]`.
func runResolve(e *env, args []string) error {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	ours := fs.Bool("ours", false, "keep the target's version")
	theirs := fs.Bool("theirs", false, "take the fork's version")
	base := fs.Bool("base", false, "go back to the fork point's version")
	file := fs.String("file", "", "the path becomes this local file's content (- is stdin)")
	mode := fs.String("mode", "", "octal mode for --file, e.g. 0644")
	asJSON := fs.Bool("json", false, "print the merge as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{"resolve: usage: berth " + resolveUsage}
	}
	var req wire.ResolveRequest
	n := 0
	for _, s := range []struct {
		on   bool
		side string
	}{{*ours, "ours"}, {*theirs, "theirs"}, {*base, "base"}} {
		if s.on {
			req.Side = s.side
			n++
		}
	}
	if *file != "" {
		n++
		var b []byte
		if *file == "-" {
			b, err = io.ReadAll(io.LimitReader(e.stdin, 64<<20))
		} else {
			b, err = os.ReadFile(*file)
		}
		if err != nil {
			return err
		}
		if b == nil {
			b = []byte{}
		}
		req.Content = b
	}
	if n != 1 {
		return usageError{"resolve: give exactly one of --ours, --theirs, --base, --file"}
	}
	if *mode != "" {
		v, err := strconv.ParseUint(*mode, 8, 32)
		if err != nil || v&^0o7777 != 0 {
			return usageError{"resolve: --mode is octal permission bits, e.g. 0644"}
		}
		m := uint32(v)
		req.Mode = &m
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	m, err := c.Resolve(e.ctx, pos[0], pos[1], req)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, m)
	}
	printMerge(e.stdout, m)
	return nil
}
