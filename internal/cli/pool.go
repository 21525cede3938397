package cli

import (
	"flag"
	"fmt"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const poolUsage = "pool set TEMPLATE --size N [--cpu C] [--memory MiB] [--disk MiB] [--runtime R] [--auto --min N --max N] | pool ls [--json] | pool rm TEMPLATE"

// runPool: warm pools of ready sandboxes per template.
func runPool(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"pool: usage: berth " + poolUsage}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	switch args[0] {
	case "set":
		fs := flag.NewFlagSet("pool set", flag.ContinueOnError)
		var req wire.PoolRequest
		size := fs.Int("size", -1, "ready sandboxes to keep")
		fs.Float64Var(&req.CPU, "cpu", 0, "CPU cores of each member (default: the server's default)")
		fs.Int64Var(&req.MemoryMiB, "memory", 0, "memory limit in MiB")
		fs.Int64Var(&req.DiskMiB, "disk", 0, "disk limit in MiB")
		fs.StringVar(&req.Runtime, "runtime", "", "runc or runsc")
		fs.BoolVar(&req.Auto, "auto", false, "size from demand between --min and --max")
		fs.IntVar(&req.Min, "min", 0, "smallest size with --auto")
		fs.IntVar(&req.Max, "max", 0, "largest size with --auto")
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 1 || *size < 0 {
			return usageError{"pool set: usage: berth pool set TEMPLATE --size N [...]"}
		}
		req.Size = size
		st, err := c.SetPool(e.ctx, pos[0], req)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "pool %s: size %d, %s\n", st.Template, st.Size, st.State)
		return nil
	case "ls":
		fs := flag.NewFlagSet("pool ls", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "JSON output")
		if _, err := parse(fs, args[1:]); err != nil {
			return err
		}
		list, err := c.Pools(e.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, list)
		}
		tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TEMPLATE\tRUNTIME\tCPU\tMEMORY\tREADY/TARGET\tSTARTING\tHITS\tMISSES\tCLAIM P50\tIDLE MEMORY\tSTATE")
		for _, p := range list {
			state := p.State
			if p.Error != "" {
				state += ": " + p.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%g\t%d MiB\t%d/%d\t%d\t%d\t%d\t%s\t%d MiB\t%s\n", p.Template, p.Runtime,
				float64(p.Resources.CPUMillis)/1000, p.Resources.MemoryMiB, p.Ready, p.Target, p.Starting, p.Hits, p.Misses,
				time.Duration(p.ClaimP50Micros)*time.Microsecond, p.IdleMemoryBytes>>20, state)
		}
		return tw.Flush()
	case "rm":
		fs := flag.NewFlagSet("pool rm", flag.ContinueOnError)
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{"pool rm: usage: berth pool rm TEMPLATE"}
		}
		return c.DeletePool(e.ctx, pos[0])
	}
	return usageError{"pool: unknown subcommand " + args[0]}
}
