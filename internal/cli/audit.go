package cli

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/duration"
)

const auditUsage = "audit ls [--since T] [--sandbox ID] [--owner O] [--after SEQ] [--limit N] [--json] | audit export [--since T] [--sandbox ID] [--owner O]   (JSON lines) | audit verify [--json]   (admin key; exit 1 when the chain was tampered with)"

// runAudit: berth audit ls | export | verify (docs/AUDIT.md).
func runAudit(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"usage: berth " + auditUsage}
	}
	switch args[0] {
	case "ls", "export":
		return runAuditList(e, args[0], args[1:])
	case "verify":
		return runAuditVerify(e, args[1:])
	}
	return usageError{"usage: berth " + auditUsage}
}

func runAuditList(e *env, verb string, args []string) error {
	fs := flag.NewFlagSet("audit "+verb, flag.ContinueOnError)
	since := fs.String("since", "", "from this time (RFC 3339) or this long ago (90m, 7d)")
	sb := fs.String("sandbox", "", "only this sandbox's entries")
	own := fs.String("owner", "", "only this owner's entries (admin key only)")
	after := fs.Int64("after", 0, "only entries after this seq")
	limit := fs.Int("limit", 0, "at most this many entries (ls; default 1000)")
	asJSON := fs.Bool("json", false, "JSON output (ls)")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) != 0 {
		return usageError{"audit " + verb + ": unexpected arguments " + strings.Join(pos, " ")}
	}
	o := client.AuditOptions{Sandbox: *sb, Owner: *own, After: *after, Limit: *limit}
	if *since != "" {
		t, err := parseSince(*since, time.Now())
		if err != nil {
			return err
		}
		o.Since = t
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	if verb == "export" {
		// Every page, one entry per line: what an outside verifier reads.
		o.Limit = 0
		for {
			page, err := c.Audit(e.ctx, o)
			if err != nil {
				return err
			}
			for _, en := range page.Entries {
				if err := printJSONLine(e.stdout, en); err != nil {
					return err
				}
			}
			if page.Next == 0 {
				return nil
			}
			o.After = page.Next
		}
	}
	page, err := c.Audit(e.ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, page)
	}
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tACTOR\tACTION\tSANDBOX\tDETAIL")
	for _, en := range page.Entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", en.Seq, en.Time.Local().Format("2006-01-02 15:04:05.000"),
			en.Actor, en.Action, en.Sandbox, auditDetail(en))
	}
	return tw.Flush()
}

// auditDetail is one line of an entry's data for the table.
func auditDetail(en wire.AuditEntry) string {
	d := en.Data
	switch en.Action {
	case "api":
		return d["method"] + " " + strings.TrimPrefix(d["route"], d["method"]+" ") + " → " + d["status"]
	case "exec":
		return d["argv"] + userSuffix(d["user"])
	}
	parts := make([]string, 0, len(d))
	for _, k := range sortedKeys(d) {
		parts = append(parts, k+"="+d[k])
	}
	s := strings.Join(parts, " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

func userSuffix(u string) string {
	if u == "" {
		return ""
	}
	return " (user " + u + ")"
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// parseSince takes an RFC 3339 time or a duration ago.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := duration.Parse(s)
	if err != nil {
		return time.Time{}, usageError{fmt.Sprintf("--since: want an RFC 3339 time or a duration (%s), got %q", duration.Forms, s)}
	}
	return now.Add(-d), nil
}

func runAuditVerify(e *env, args []string) error {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) != 0 {
		return usageError{"audit verify: unexpected arguments " + strings.Join(pos, " ")}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	rep, err := c.VerifyAudit(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := printJSON(e.stdout, rep); err != nil {
			return err
		}
	} else if rep.OK {
		fmt.Fprintf(e.stdout, "ok: %d entries, chain intact up to seq %d (head %s)\n", rep.Entries, rep.LastSeq, shortHash(rep.LastHash))
	} else {
		fmt.Fprintf(e.stdout, "TAMPERED: %d problem(s) in %d entries\n", rep.Total, rep.Entries)
		for _, p := range rep.Problems {
			fmt.Fprintf(e.stdout, "  seq %d: %s: %s\n", p.Seq, p.Kind, p.Message)
		}
		if rep.Total > len(rep.Problems) {
			fmt.Fprintf(e.stdout, "  ... and %d more\n", rep.Total-len(rep.Problems))
		}
	}
	if !rep.OK {
		return exitStatus{ExitError}
	}
	return nil
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
