package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const noteUsage = "note ID [--json] | note ID --write [--reason R] [--unfinished U] [--next N] [--context-version V] [--json] | note ID --list [--json] | note ID --seq N [--json]"

// runNote: `berth note ID` shows the newest handoff note; --write writes
// one now, --list lists them, --seq shows one.
func runNote(e *env, args []string) error {
	fs := flag.NewFlagSet("note", flag.ContinueOnError)
	write := fs.Bool("write", false, "write a note now (collects the machine state of a running sandbox)")
	list := fs.Bool("list", false, "list the kept notes, newest first")
	seq := fs.Int64("seq", 0, "show note number N")
	var req wire.NoteRequest
	fs.StringVar(&req.Reason, "reason", "", "why the agent stopped (with --write)")
	fs.StringVar(&req.Unfinished, "unfinished", "", "what is unfinished (with --write)")
	fs.StringVar(&req.Next, "next", "", "the next step (with --write)")
	fs.StringVar(&req.ContextVersion, "context-version", "", "the version id of the agent's model context (with --write)")
	asJSON := fs.Bool("json", false, "JSON output")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	supplied := req != (wire.NoteRequest{})
	modes := 0
	for _, b := range []bool{*write, *list, *seq != 0} {
		if b {
			modes++
		}
	}
	switch {
	case modes > 1:
		return usageError{"note: use one of --write, --list, --seq"}
	case supplied && !*write:
		return usageError{"note: --reason, --unfinished, --next and --context-version go with --write"}
	}
	n := c.Sandbox(id).Notes()
	switch {
	case *write:
		note, err := n.Write(e.ctx, req)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, note)
		}
		printNote(e.stdout, note, nil)
		return nil
	case *list:
		all, err := n.List(e.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, wire.NoteList{Notes: all})
		}
		tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tCREATED\tTRIGGER\tFILES\tREPOS\tCONTEXT\tREASON")
		for _, x := range all {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\n", x.Seq, x.CreatedAt.Local().Format(time.DateTime), x.Trigger,
				x.Files.Total, len(x.Repos), oneLine(x.ContextVersion, 24), oneLine(x.Reason, 40))
		}
		return tw.Flush()
	case *seq != 0:
		note, err := n.Get(e.ctx, *seq)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, note)
		}
		printNote(e.stdout, note, nil)
		return nil
	}
	cur, err := n.Current(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, cur)
	}
	if cur.Note == nil {
		fmt.Fprintf(e.stdout, "%s has no handoff note yet (one is written on pause and stop, or with --write)\n", id)
		return nil
	}
	printNote(e.stdout, *cur.Note, cur.Desync)
	return nil
}

// oneLine is s on one line, at most n runes (terminal-safe: sandbox text).
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return sanitize(s)
}

// sanitize drops control characters: a note's text came from a sandbox.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 {
			return -1
		}
		return r
	}, s)
}

func printNote(w io.Writer, n wire.Note, desync *wire.Desync) {
	fmt.Fprintf(w, "note #%d of %s (%s, %s", n.Seq, n.SandboxID, n.Trigger, n.CreatedAt.Local().Format(time.DateTime))
	if n.Actor != "" {
		fmt.Fprintf(w, ", by %s", sanitize(n.Actor))
	}
	fmt.Fprintln(w, ")")
	if n.InheritedFrom != nil {
		fmt.Fprintf(w, "  inherited from note #%d of %s\n", n.InheritedFrom.Seq, n.InheritedFrom.SandboxID)
	}
	if n.RestoredFrom != nil {
		fmt.Fprintf(w, "  restored: the note of that point is #%d of %s\n", n.RestoredFrom.Seq, n.RestoredFrom.SandboxID)
	}
	if desync == nil {
		desync = n.Desync
	}
	if desync != nil {
		fmt.Fprintf(w, "  DESYNC: %s\n", sanitize(desync.Message))
	}
	for _, x := range n.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", sanitize(x))
	}
	for _, f := range []struct{ k, v string }{{"reason", n.Reason}, {"unfinished", n.Unfinished}, {"next", n.Next}, {"context", n.ContextVersion}} {
		if f.v != "" {
			fmt.Fprintf(w, "  %-10s %s\n", f.k+":", strings.ReplaceAll(sanitize(f.v), "\n", "\n             "))
		}
	}
	since := "the template"
	if n.Files.SinceSeq > 0 {
		since = fmt.Sprintf("note #%d", n.Files.SinceSeq)
	}
	fmt.Fprintf(w, "  files since %s: %d changed (%d added, %d modified, %d deleted)\n", since, n.Files.Total, n.Files.Added, n.Files.Modified, n.Files.Deleted)
	for _, c := range n.Files.Changes {
		size := fmt.Sprintf("%d B", c.Size)
		if c.Kind == "deleted" {
			size = ""
		}
		fmt.Fprintf(w, "    %-8s /%s %s\n", c.Kind, oneLine(c.Path, 200), size)
	}
	if more := n.Files.Total - len(n.Files.Changes); more > 0 {
		fmt.Fprintf(w, "    ... and %d more\n", more)
	}
	if n.Files.Error != "" {
		fmt.Fprintf(w, "    (%s)\n", sanitize(n.Files.Error))
	}
	for _, r := range n.Repos {
		fmt.Fprintf(w, "  repo %s", oneLine(r.Path, 200))
		if r.Error != "" {
			fmt.Fprintf(w, ": %s\n", oneLine(r.Error, 200))
			continue
		}
		fmt.Fprintf(w, " on %s at %s: %d dirty, %d unpushed\n", oneLine(r.Branch, 80), oneLine(r.Head, 40), r.DirtyTotal, r.UnpushedTotal)
		for _, d := range r.Dirty {
			fmt.Fprintf(w, "    %s\n", oneLine(d, 200))
		}
		for _, u := range r.Unpushed {
			fmt.Fprintf(w, "    unpushed %s\n", oneLine(u, 200))
		}
	}
	if n.GitError != "" {
		fmt.Fprintf(w, "  (git: %s)\n", sanitize(n.GitError))
	}
	if len(n.Processes) > 0 {
		fmt.Fprintf(w, "  processes:\n")
		for _, p := range n.Processes {
			fmt.Fprintf(w, "    %6d %s\n", p.Pid, oneLine(strings.Join(p.Argv, " "), 160))
		}
	}
}
