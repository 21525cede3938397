package cli

import (
	"flag"
	"fmt"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const (
	checkpointUsage = "checkpoint ID [--name N] [--memory] [--json] | checkpoint rm ID CHECKPOINT..."
	timelineUsage   = "timeline ID [--json]"
	rewindUsage     = "rewind ID --to CHECKPOINT [--json]   (CHECKPOINT: id, name or seq)"
	promoteUsage    = "promote CHILD [--discard-others] [--json]"
)

// runCheckpoint: `berth checkpoint ID [--name N] [--memory]`, `berth checkpoint rm ID C...`.
func runCheckpoint(e *env, args []string) error {
	if len(args) > 0 && args[0] == "rm" {
		fs := flag.NewFlagSet("checkpoint rm", flag.ContinueOnError)
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) < 2 {
			return usageError{"checkpoint rm: usage: berth checkpoint rm ID CHECKPOINT..."}
		}
		c, err := newClient()
		if err != nil {
			return err
		}
		tl := c.Sandbox(pos[0]).Timeline()
		for _, ref := range pos[1:] {
			if err := tl.Delete(e.ctx, ref); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, ref)
		}
		return nil
	}
	fs := flag.NewFlagSet("checkpoint", flag.ContinueOnError)
	name := fs.String("name", "", "a name for the checkpoint (unique on the sandbox's timeline)")
	memory := fs.Bool("memory", false, "take a memory image too, where the runtime can")
	asJSON := fs.Bool("json", false, "print the checkpoint as JSON")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	ck, err := c.Sandbox(id).Timeline().Checkpoint(e.ctx, checkpointRequest(*name, *memory))
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, ck)
	}
	msg := fmt.Sprintf("checkpoint #%d of %s: %s, %d bytes of changes", ck.Seq, id, ck.Mode, ck.Bytes)
	if ck.Reason != "" {
		msg += " (" + ck.Reason + ")"
	}
	fmt.Fprintln(e.stderr, msg)
	fmt.Fprintln(e.stdout, ck.ID)
	return nil
}

// runTimeline: `berth timeline ID [--json]`.
func runTimeline(e *env, args []string) error {
	fs := flag.NewFlagSet("timeline", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	tl, err := c.Sandbox(id).Timeline().List(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, tl)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tNAME\tMODE\tBYTES\tENTRIES\tHEAD\tCREATED")
	now := time.Now()
	for _, ck := range tl.Checkpoints {
		head := ""
		if ck.Head {
			head = "*"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s ago\n", ck.Seq, ck.ID, ck.Name, ck.Mode, ck.Bytes, ck.Entries, head, short(now.Sub(ck.Created)))
	}
	return tw.Flush()
}

// runRewind: `berth rewind ID --to CHECKPOINT`.
func runRewind(e *env, args []string) error {
	fs := flag.NewFlagSet("rewind", flag.ContinueOnError)
	to := fs.String("to", "", "the checkpoint (id, name or seq)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	if *to == "" {
		return usageError{"rewind: --to CHECKPOINT is required (see `berth timeline " + id + "`)"}
	}
	res, err := c.Sandbox(id).Timeline().Rewind(e.ctx, *to)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, res)
	}
	msg := fmt.Sprintf("rewound %s to checkpoint #%d (%s) in %d ms, mode %s", id, res.Checkpoint.Seq, res.Checkpoint.ID, res.Millis, res.Mode)
	if res.Reason != "" {
		msg += ": " + res.Reason
	}
	fmt.Fprintln(e.stderr, msg)
	if res.TaskRollback != nil {
		printRollback(e.stderr, res.TaskRollback)
	}
	if n := len(res.EffectsAfter); n > 0 {
		fmt.Fprintf(e.stderr, "%d outside effect(s) happened after that point and are not undone (a retry is answered from the ledger):\n", n)
		_ = printEffects(e.stderr, res.EffectsAfter)
	}
	fmt.Fprintln(e.stdout, id)
	return nil
}

// runPromote: `berth promote CHILD [--discard-others]`.
func runPromote(e *env, args []string) error {
	fs := flag.NewFlagSet("promote", flag.ContinueOnError)
	discard := fs.Bool("discard-others", false, "delete the parent's other fork children afterwards")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	res, err := c.Sandbox(id).Timeline().Promote(e.ctx, *discard)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, res)
	}
	msg := fmt.Sprintf("promoted %s into %s in %d ms, mode %s", res.From, res.Parent.ID, res.Millis, res.Mode)
	if res.Reason != "" {
		msg += ": " + res.Reason
	}
	if len(res.Discarded) > 0 {
		msg += fmt.Sprintf("; discarded %d other child(ren)", len(res.Discarded))
	}
	fmt.Fprintln(e.stderr, msg)
	fmt.Fprintln(e.stdout, res.Parent.ID)
	return nil
}

func checkpointRequest(name string, memory bool) wire.CheckpointRequest {
	return wire.CheckpointRequest{Name: name, Memory: memory}
}
