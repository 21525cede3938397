package cli

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/duration"
)

const (
	costUsage    = "cost [--by owner|template] [--step D] [--since T] [--owner O] [--json]   (cost per bucket on both bases)"
	cleanupUsage = "cleanup [--days N] [--snapshot S]... ID...   (delete orphans of `berth report orphans --days N` that still are)"
	buildsUsage  = "builds [TEMPLATE] [--limit N] [--json]   (template build history, newest first)"
)

// runCost: berth cost [--by owner|template] [--step D] [--since T] [--owner O] [--json]
func runCost(e *env, args []string) error {
	fs := flag.NewFlagSet("cost", flag.ContinueOnError)
	by := fs.String("by", "owner", "group by owner or template")
	step := fs.String("step", "1h", "bucket length, whole hours (1h, 6h, 1d)")
	since := fs.String("since", "24h", "from this long ago (or an RFC 3339 time)")
	own := fs.String("owner", "", "only this owner (admin key only)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError{"usage: berth " + costUsage}
	}
	o := client.SeriesOptions{Owner: *own, By: *by}
	if o.Step, err = duration.Parse(*step); err != nil {
		return usageError{fmt.Sprintf("--step: %v", err)}
	}
	if t, err := time.Parse(time.RFC3339, *since); err == nil {
		o.From = t
	} else if d, err := duration.Parse(*since); err == nil {
		o.From = time.Now().Add(-d)
	} else {
		return usageError{fmt.Sprintf("--since: want a duration like 24h or 7d, or an RFC 3339 time; got %q", *since)}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	ser, err := c.UsageSeries(e.ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, ser)
	}
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tRESERVED\tACTIVE\tRESERVED PER BUCKET (%s)\n", strings.ToUpper(ser.By), time.Duration(ser.StepSeconds)*time.Second)
	for _, l := range ser.Lines {
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%s\n", l.Key, l.TotalReserved, l.TotalActive, spark(l.Reserved))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s to %s, prices in %s\n", ser.From.Local().Format(time.DateTime), ser.To.Local().Format(time.DateTime), ser.Prices.Currency)
	return nil
}

// spark draws values as a one-line bar chart.
func spark(vs []float64) string {
	bars := []rune(" ▁▂▃▄▅▆▇█")
	hi := 0.0
	for _, v := range vs {
		hi = max(hi, v)
	}
	out := make([]rune, len(vs))
	for i, v := range vs {
		n := 0
		if hi > 0 {
			n = int(v / hi * float64(len(bars)-1))
			if v > 0 && n == 0 {
				n = 1
			}
		}
		out[i] = bars[n]
	}
	return string(out)
}

// runCleanup: berth cleanup [--days N] [--snapshot S]... ID...
func runCleanup(e *env, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	days := fs.Int("days", 7, "only what is untouched for at least this many days")
	var snaps multi
	fs.Var(&snaps, "snapshot", "a snapshot to delete (repeatable)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 && len(snaps) == 0 {
		return usageError{"usage: berth " + cleanupUsage}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	res, err := c.CleanupOrphans(e.ctx, wire.OrphanCleanupRequest{Days: days, Sandboxes: pos, Snapshots: snaps})
	if err != nil {
		return err
	}
	for _, d := range res.Deleted {
		fmt.Fprintf(e.stdout, "deleted %s %s\n", d.Kind, d.ID)
	}
	for _, r := range res.Refused {
		fmt.Fprintf(e.stderr, "left %s %s: %s\n", r.Kind, r.ID, printable(r.Error.Message))
	}
	if len(res.Refused) > 0 {
		return exitStatus{ExitConflict} // scripts: something named was left alone
	}
	return nil
}

// runBuilds: berth builds [TEMPLATE] [--limit N] [--json]
func runBuilds(e *env, args []string) error {
	fs := flag.NewFlagSet("builds", flag.ContinueOnError)
	limit := fs.Int("limit", 50, "at most this many (0 = all kept)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageError{"usage: berth " + buildsUsage}
	}
	name := ""
	if len(pos) == 1 {
		name = pos[0]
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	list, err := c.TemplateBuilds(e.ctx, name, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tKIND\tRESULT\tSTARTED\tDURATION\tFINGERPRINT\tSOURCE / ERROR")
	for _, b := range list {
		detail := b.Source
		if b.Error != "" {
			detail = b.Error
		}
		fp := b.Fingerprint
		if len(fp) > 12 {
			fp = fp[:12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.Template, b.Kind, b.Result, b.StartedAt.Local().Format(time.DateTime),
			(time.Duration(b.Millis) * time.Millisecond).String(), fp, printable(detail))
	}
	return tw.Flush()
}
