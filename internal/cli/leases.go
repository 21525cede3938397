package cli

import (
	"flag"
	"fmt"
	"time"
)

// runLeases is `berth secret leases [ID] [--json]` and `berth secret revoke LEASE`
// (credential leases, docs/LEASES.md).
func runLeases(e *env, sub string, args []string) error {
	fs := flag.NewFlagSet("secret "+sub, flag.ContinueOnError)
	own := fs.String("owner", "", "owner (admin key only)")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	if sub == "revoke" {
		id, err := one(fs, pos, "lease id")
		if err != nil {
			return err
		}
		l, err := c.RevokeLease(e.ctx, id)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, l)
		}
		fmt.Fprintf(e.stdout, "%s revoked (%s on %s, generation %d)\n", l.ID, l.Secret, l.SandboxID, l.Generation)
		return nil
	}
	if len(pos) > 1 {
		return usageError{"secret leases: at most one sandbox id"}
	}
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	list, err := c.Leases(e.ctx, *own, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LEASE\tSANDBOX\tGEN\tSECRET\tSCOPE\tSTATE\tREASON\tISSUED\tEXPIRES")
	for _, l := range list {
		exp := "with sandbox"
		if l.ExpiresAt != nil {
			exp = l.ExpiresAt.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s %s\t%s\t%s\t%s\t%s\n", l.ID, l.SandboxID, l.Generation, l.Secret, l.Host, l.Header,
			l.State, l.Reason, l.IssuedAt.Local().Format(time.RFC3339), exp)
	}
	return tw.Flush()
}
