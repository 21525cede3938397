package cli

import (
	"flag"
	"time"

	"github.com/berth-dev/berth/internal/fleetsim"
)

const simUsage = "sim [--seed N] [--nodes N] [--node-cpu C] [--node-memory MiB] [--node-disk MiB] [--days D] [--tasks-per-day N] [--hit-rate F] [--wait-slo D] [--no-sizing] [--markdown | --json]   (fleet simulator: berth's placement vs best-of-3 vs round-robin; see docs/CLUSTER.md)"

// runSim runs the fleet simulator locally; it needs no server.
func runSim(e *env, args []string) error {
	cfg := fleetsim.DefaultConfig()
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "trace seed (the same seed gives the same report)")
	fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "simulated nodes")
	cpu := fs.Float64("node-cpu", float64(cfg.Node.CPUMillis)/1000, "CPU cores per node")
	fs.Int64Var(&cfg.Node.MemoryMiB, "node-memory", cfg.Node.MemoryMiB, "memory per node in MiB")
	fs.Int64Var(&cfg.Node.DiskMiB, "node-disk", cfg.Node.DiskMiB, "disk per node in MiB")
	fs.Float64Var(&cfg.Days, "days", cfg.Days, "simulated days")
	fs.IntVar(&cfg.TasksPerDay, "tasks-per-day", cfg.TasksPerDay, "tasks per day")
	fs.Float64Var(&cfg.HitRate, "hit-rate", cfg.HitRate, "warm-pool hit rate the pools are sized for")
	slo := fs.String("wait-slo", cfg.WaitSLO.String(), "p99 wait for a slot the node count is sized for")
	noSizing := fs.Bool("no-sizing", false, "skip the search for the node count each policy needs")
	markdown := fs.Bool("markdown", false, "Markdown table (the default output)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError{"sim: usage: berth " + simUsage}
	}
	if *markdown && *asJSON {
		return usageError{"sim: --markdown and --json exclude each other"}
	}
	d, err := time.ParseDuration(*slo)
	if err != nil || d <= 0 {
		return usageError{"sim: --wait-slo: " + *slo + " is not a positive duration (e.g. 10s)"}
	}
	cfg.WaitSLO = d
	cfg.Node.CPUMillis = int64(*cpu * 1000)
	cfg.SizeNodes = !*noSizing
	rep, err := fleetsim.Run(cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, rep)
	}
	return rep.Markdown(e.stdout)
}
