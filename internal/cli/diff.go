package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

const diffUsage = "diff A [B] [--checkpoint C] [--stat] [--json] [--path P]... [--max-text N] [-- PATH...]   (A's changes since its fork point; with B: A's tree → B's)"

const compareUsage = "compare ID [--check CMD] [--timeout D] [--json]   (the forks of ID: diff stat, check, cost; passing first)"

// runDiff: `berth diff A [B] [--checkpoint C] ...`.
func runDiff(e *env, args []string) error {
	fs := flag.NewFlagSet("diff", flag.ContinueOnError)
	var paths multi
	fs.Var(&paths, "path", "only changes at or below PATH, or matching it as a pattern (repeatable)")
	checkpoint := fs.String("checkpoint", "", "diff against checkpoint C of A")
	stat := fs.Bool("stat", false, "a summary line per path, no text diffs")
	asJSON := fs.Bool("json", false, "the diff as JSON")
	maxText := fs.Int64("max-text", 0, "largest file (bytes) diffed as text (default 1 MiB)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	// Positionals after the ids are paths: `berth diff A B src/`; one
	// that looks like a sandbox id goes after "--": `berth diff A -- src`.
	o := client.DiffOptions{Stat: *stat, MaxText: *maxText, Paths: paths}
	var after []string
	for i, p := range pos {
		if p == "--" {
			pos, after = pos[:i], pos[i+1:]
			break
		}
	}
	if len(pos) == 0 {
		return usageError{"diff: expected a sandbox id"}
	}
	ids, rest := pos[:1], pos[1:]
	if len(rest) > 0 && *checkpoint == "" && isSandboxID(rest[0]) {
		ids, rest = pos[:2], pos[2:]
	}
	o.Paths = append(append(o.Paths, rest...), after...)
	switch {
	case len(ids) == 2 && *checkpoint != "":
		return usageError{"diff: give B or --checkpoint, not both"}
	case len(ids) == 2:
		o.Against = ids[1]
	case *checkpoint != "":
		o.Against = "checkpoint:" + *checkpoint
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	res, err := c.Sandbox(ids[0]).Diff(e.ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, res)
	}
	if *stat {
		return writeDiffStat(e.stdout, res)
	}
	return writePatch(e.stdout, res)
}

// isSandboxID tells a sandbox id from a path: ids are [a-z0-9]{1,64}.
func isSandboxID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

func sizeOf(n *wire.DiffNode) string {
	if n == nil || n.Type != "file" {
		return "-"
	}
	return fmt.Sprintf("%d bytes", n.Size)
}

func digestOf(n *wire.DiffNode) string {
	if n == nil || n.SHA256 == "" {
		return "-"
	}
	return "sha256:" + n.SHA256[:min(16, len(n.SHA256))]
}

// describeChange is one line about a change (everything in it the
// sandbox chose goes through printable).
func describeChange(c wire.DiffChange) string {
	parts := []string{c.Kind}
	switch {
	case c.Refused != "":
		parts = append(parts, "refused ("+printable(c.Refused)+")")
	case c.Binary:
		parts = append(parts, fmt.Sprintf("binary %s -> %s", sizeOf(c.Old), sizeOf(c.New)))
	case c.LinesAdded+c.LinesRemoved > 0:
		parts = append(parts, fmt.Sprintf("+%d -%d", c.LinesAdded, c.LinesRemoved))
	}
	if c.TypeChanged && c.Old != nil && c.New != nil {
		parts = append(parts, fmt.Sprintf("type %s -> %s", c.Old.Type, c.New.Type))
	}
	if c.ModeChanged && c.Old != nil && c.New != nil {
		parts = append(parts, fmt.Sprintf("mode %04o -> %04o", c.Old.Mode, c.New.Mode))
	}
	if c.OwnerChanged && c.Old != nil && c.New != nil {
		parts = append(parts, fmt.Sprintf("owner %d:%d -> %d:%d", c.Old.UID, c.Old.GID, c.New.UID, c.New.GID))
	}
	n := c.New
	if n == nil {
		n = c.Old
	}
	if n != nil && n.Type == "symlink" {
		parts = append(parts, "symlink -> "+printable(n.Target))
	} else if n != nil && n.Type != "file" {
		parts = append(parts, printable(n.Type))
	}
	if c.RenamedFrom != "" {
		parts = append(parts, "renamed from "+printable(c.RenamedFrom))
	}
	if c.RenamedTo != "" {
		parts = append(parts, "renamed to "+printable(c.RenamedTo))
	}
	if c.TextOmitted != "" {
		parts = append(parts, "text omitted: "+printable(c.TextOmitted))
	}
	return strings.Join(parts, ", ")
}

func writeDiffStat(w io.Writer, r wire.DiffResult) error {
	tw := newTabWriter(w, 2, 4, 1, ' ', 0)
	for _, c := range r.Changes {
		fmt.Fprintf(tw, " %s\t| %s\n", printable(c.Path), describeChange(c))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.Stat
	_, err := fmt.Fprintf(w, " %d paths changed (%d added, %d deleted, %d modified), %d insertions(+), %d deletions(-)\n",
		s.Files, s.Added, s.Deleted, s.Modified, s.LinesAdded, s.LinesRemoved)
	return err
}

func writePatch(w io.Writer, r wire.DiffResult) error {
	for _, c := range r.Changes {
		var err error
		switch {
		case c.Unified != "":
			for _, l := range strings.SplitAfter(c.Unified, "\n") {
				if l == "" {
					continue
				}
				if _, err = fmt.Fprintln(w, printable(strings.TrimSuffix(l, "\n"))); err != nil {
					return err
				}
			}
		case c.Binary:
			_, err = fmt.Fprintf(w, "Binary %s %s: %s (%s) -> %s (%s)\n", printable(c.Path), c.Kind, sizeOf(c.Old), digestOf(c.Old), sizeOf(c.New), digestOf(c.New))
		default:
			_, err = fmt.Fprintf(w, "%s: %s\n", printable(c.Path), describeChange(c))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// runCompare: `berth compare ID [--check CMD] [--timeout D] [--json]`.
func runCompare(e *env, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	check := fs.String("check", "", "shell command run in every child (e.g. 'pytest -q')")
	timeout := fs.String("timeout", "", "bound of each check (default 10m)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	id, err := one(fs, pos, "sandbox id")
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	res, err := c.Sandbox(id).Compare(e.ctx, wire.CompareRequest{Check: *check, Timeout: *timeout})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, res)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCHECK\tMS\tFILES\t+LINES\t-LINES\tCOST\tNOTE")
	for _, ch := range res.Children {
		verdict, ms := "-", "-"
		if ch.Check != nil {
			ms = fmt.Sprint(ch.Check.Ms)
			switch {
			case ch.Check.Error != "":
				verdict = "error"
			case ch.Check.TimedOut:
				verdict = "timeout"
			case ch.Check.Signal != "":
				verdict = "signal " + printable(ch.Check.Signal)
			case ch.Check.ExitCode == 0:
				verdict = "pass"
			default:
				verdict = fmt.Sprintf("fail (%d)", ch.Check.ExitCode)
			}
		}
		files, plus, minus := "-", "-", "-"
		if ch.Stat != nil {
			files, plus, minus = fmt.Sprint(ch.Stat.Files), fmt.Sprint(ch.Stat.LinesAdded), fmt.Sprint(ch.Stat.LinesRemoved)
		}
		cost := "-"
		if ch.Cost != nil {
			cost = fmt.Sprintf("%.4f", ch.Cost.CostActive)
		}
		note := ch.Error
		if note == "" && ch.Check != nil {
			note = ch.Check.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ch.ID, ch.State, verdict, ms, files, plus, minus, cost, printable(note))
	}
	return tw.Flush()
}
