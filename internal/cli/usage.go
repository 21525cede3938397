package cli

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// runUsage: berth usage [--owner O] [--since T] [--sandbox ID] [--json]
func runUsage(e *env, args []string) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	own := fs.String("owner", "", "only this owner (admin key only)")
	since := fs.String("since", "", "from this time (RFC 3339) or this long ago (24h, 7d); hour granularity")
	sbID := fs.String("sandbox", "", "only this sandbox")
	perSandbox := fs.Bool("sandboxes", false, "one line per sandbox instead of per owner")
	asJSON := fs.Bool("json", false, "JSON output")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) != 0 {
		return usageError{"usage: unexpected arguments " + strings.Join(pos, " ")}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	rep, err := c.Usage(e.ctx, client.UsageOptions{Owner: *own, SinceText: *since, SandboxID: *sbID})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, rep)
	}
	lines, first := rep.Owners, "OWNER"
	if *perSandbox || *sbID != "" {
		lines, first = rep.Sandboxes, "SANDBOX"
	}
	cur := rep.Prices.Currency
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tCPU-S\tMEM GIB-S\tMEM AVG/PEAK MIB\tRUNNING\tFROZEN\tPAUSED\tSTOPPED\tDISK GIB-H\tRESERVED %s\tACTIVE %s\n", first, cur, cur)
	for _, l := range lines {
		name := l.Owner
		if first == "SANDBOX" {
			name = l.SandboxID
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.0f/%.0f\t%s\t%s\t%s\t%s\t%.3f\t%.4f\t%.4f\n", name, l.CPUSeconds, l.MemGiBSeconds,
			l.MemAvgMiB, l.MemPeakMiB, secs(l.RunningSeconds), secs(l.FrozenSeconds), secs(l.PausedSeconds),
			secs(l.StoppedSeconds), l.DiskGiBHours, l.CostReserved, l.CostActive)
	}
	return tw.Flush()
}

func secs(s float64) string { return short(time.Duration(s * float64(time.Second))) }

// runReport: berth report orphans [--days N] [--owner O] [--json]
func runReport(e *env, args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	days := fs.Int("days", 7, "untouched for at least this many days")
	own := fs.String("owner", "", "only this owner (admin key only)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] != "orphans" {
		return usageError{"usage: berth report orphans [--days N] [--json]"}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	rep, err := c.Orphans(e.ctx, *days, *own)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, rep)
	}
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tID\tOWNER\tSTATE\tAGE\tIDLE\tRESERVED COST\tACTIVE COST")
	for _, o := range rep.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1fd\t%.1fd\t%.4f\t%.4f\n", o.Kind, o.ID, o.Owner, o.State, o.AgeDays, o.IdleDays, o.CostReserved, o.CostActive)
	}
	return tw.Flush()
}

// runQuota: berth quota set OWNER [--sandboxes N] [--cpu N] [--memory MiB] [--disk MiB] [--snapshots N]
// | quota get OWNER | quota ls | quota rm OWNER
func runQuota(e *env, args []string) error {
	fs := flag.NewFlagSet("quota", flag.ContinueOnError)
	var l wire.QuotaLimits
	fs.IntVar(&l.Sandboxes, "sandboxes", 0, "max concurrent sandboxes (0 = unlimited)")
	fs.Float64Var(&l.CPU, "cpu", 0, "max total vCPU")
	fs.Int64Var(&l.MemoryMiB, "memory", 0, "max total memory, MiB")
	fs.Int64Var(&l.DiskMiB, "disk", 0, "max total disk, MiB")
	fs.IntVar(&l.Snapshots, "snapshots", 0, "max snapshots")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	bad := usageError{"usage: berth quota set OWNER [--sandboxes N] [--cpu N] [--memory MiB] [--disk MiB] [--snapshots N] | quota get OWNER | quota ls | quota rm OWNER"}
	if len(pos) == 0 {
		return bad
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	var out []wire.QuotaInfo
	switch {
	case pos[0] == "ls" && len(pos) == 1:
		if out, err = c.Quotas(e.ctx); err != nil {
			return err
		}
	case pos[0] == "get" && len(pos) == 2, pos[0] == "set" && len(pos) == 2:
		var qi wire.QuotaInfo
		if pos[0] == "set" {
			qi, err = c.SetQuota(e.ctx, pos[1], l)
		} else {
			qi, err = c.Quota(e.ctx, pos[1])
		}
		if err != nil {
			return err
		}
		out = []wire.QuotaInfo{qi}
	case pos[0] == "rm" && len(pos) == 2:
		return c.DeleteQuota(e.ctx, pos[1])
	default:
		return bad
	}
	if *asJSON {
		return printJSON(e.stdout, out)
	}
	lim := func(v float64, used float64) string {
		if v == 0 {
			return fmt.Sprintf("%g/-", used)
		}
		return fmt.Sprintf("%g/%g", used, v)
	}
	tw := newTabWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OWNER\tSOURCE\tSANDBOXES\tCPU\tMEMORY MIB\tDISK MIB\tSNAPSHOTS")
	for _, q := range out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.Owner, q.Source,
			lim(float64(q.Limits.Sandboxes), float64(q.Use.Sandboxes)), lim(q.Limits.CPU, q.Use.CPU),
			lim(float64(q.Limits.MemoryMiB), float64(q.Use.MemoryMiB)), lim(float64(q.Limits.DiskMiB), float64(q.Use.DiskMiB)),
			lim(float64(q.Limits.Snapshots), float64(q.Use.Snapshots)))
	}
	return tw.Flush()
}
