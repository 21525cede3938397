package cli

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const effectsUsage = "effects ID [--since TIME|CHECKPOINT] [--json]   (the side-effect ledger: what already happened outside)"

// effectFlags registers --effectful, --idempotency and --repeat (create and
// net set); the returned func gives the settings, nil when none was set.
func effectFlags(fs *flag.FlagSet) func() *wire.EffectSettings {
	hosts := &multi{}
	fs.Var(hosts, "effectful", "record side effects (non-GET requests) to HOST or *.domain, optionally :PORT, in the side-effect ledger (repeatable)")
	idem := fs.String("idempotency", "", "keep (the agent's Idempotency-Key only) or derive (berth adds one where the agent set none)")
	repeat := fs.String("repeat", "", "what a fork's or restored sandbox's repeat of a completed effect gets: replay (the recorded answer) or refuse (409)")
	return func() *wire.EffectSettings {
		if len(*hosts) == 0 && *idem == "" && *repeat == "" {
			return nil
		}
		return &wire.EffectSettings{Effectful: *hosts, Idempotency: *idem, Repeat: *repeat}
	}
}

// runEffects: `berth effects ID [--since TIME|CHECKPOINT] [--json]`.
func runEffects(e *env, args []string) error {
	fs := flag.NewFlagSet("effects", flag.ContinueOnError)
	since := fs.String("since", "", "only effects started after an RFC 3339 time or a checkpoint (id, name or seq)")
	asJSON := fs.Bool("json", false, "JSON output")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	list, err := c.Sandbox(id).Effects(e.ctx, *since)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	return printEffects(e.stdout, list.Effects)
}

func printEffects(w io.Writer, list []wire.Effect) error {
	tw := newTabWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWHEN\tMETHOD\tHOST\tPATH\tSTATE\tSTATUS\tKEY\tREPLAY\tFROM")
	now := time.Now()
	for _, ef := range list {
		status, key, replay, from := "-", "-", "no", "own"
		if ef.Status != 0 {
			status = strconv.Itoa(ef.Status)
		}
		if ef.IdempotencyKey != "" {
			key = ef.KeySource
		}
		if ef.Replayable {
			replay = "yes"
		}
		if ef.Inherited {
			from = "inherited:" + ef.Sandbox
		}
		fmt.Fprintf(tw, "%s\t%s ago\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ef.ID, short(now.Sub(ef.StartedAt)), printable(ef.Method), printable(ef.Host),
			printable(ef.Path), ef.State, status, key, replay, from)
	}
	return tw.Flush()
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
