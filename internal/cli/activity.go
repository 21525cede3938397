package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

const activityUsage = "activity ID [--follow] [--json] [--kind K[,K]...] [--after SEQ] [--limit N]"

// runActivity prints a sandbox's activity timeline: one line per entry
// (time, kind, summary), or JSON (with --follow: one entry per line).
func runActivity(e *env, args []string) error {
	fs := flag.NewFlagSet("activity", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output (with --follow: one entry per line)")
	follow := fs.Bool("follow", false, "keep printing new entries until the sandbox is deleted (or ^C)")
	fs.BoolVar(follow, "f", false, "short for --follow")
	kind := fs.String("kind", "", "only these kinds, comma-separated: lifecycle, exec, file, egress, pause, resume, reaper, dropped")
	after := fs.Int64("after", 0, "only entries after this seq")
	limit := fs.Int("limit", 0, "at most this many entries (default 1000; without --follow)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{"activity: usage: berth " + activityUsage}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	o := client.ActivityOptions{After: *after, Limit: *limit}
	if *kind != "" {
		o.Kinds = strings.Split(*kind, ",")
	}
	sb := c.Sandbox(pos[0])
	if !*follow {
		list, err := sb.Activity(e.ctx, o)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, list)
		}
		for _, en := range list.Entries {
			printActivity(e.stdout, en)
		}
		return nil
	}
	st, err := sb.FollowActivity(e.ctx, o)
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		en, err := st.Next()
		if errors.Is(err, io.EOF) || e.ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if *asJSON {
			if err := printJSONLine(e.stdout, en); err != nil {
				return err
			}
			continue
		}
		printActivity(e.stdout, en)
	}
}

// printActivity prints one line; the summary may quote what a sandbox
// wrote (paths, hosts), so it is made printable.
func printActivity(w io.Writer, en wire.ActivityEntry) {
	fmt.Fprintf(w, "%s  %-9s %s\n", en.Time.Local().Format("2006-01-02 15:04:05.000"), en.Kind, printable(en.Summary))
}

func printJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
