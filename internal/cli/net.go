package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// policyFlags registers --allow, --deny and --network (create and net set).
func policyFlags(fs *flag.FlagSet) (allow, deny *multi, mode *string) {
	allow, deny = &multi{}, &multi{}
	fs.Var(allow, "allow", "allow egress to RULE: CIDR, IP, host or *.domain, optionally :PORT (repeatable)")
	fs.Var(deny, "deny", "deny egress to RULE (repeatable)")
	mode = fs.String("network", "", "default for what no rule matches: deny-all or allow-all (default: the server's)")
	return allow, deny, mode
}

func runNet(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"net: expected set, show or log"}
	}
	switch args[0] {
	case "set":
		return runNetSet(e, args[1:])
	case "show":
		return runNetShow(e, args[1:])
	case "log":
		return runNetLog(e, args[1:])
	}
	return usageError{fmt.Sprintf("net: unknown subcommand %q (want set, show or log)", args[0])}
}

func runNetSet(e *env, args []string) error {
	fs := flag.NewFlagSet("net set", flag.ContinueOnError)
	allow, deny, mode := policyFlags(fs)
	effects := effectFlags(fs)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	info, err := c.Sandbox(id).SetNetwork(e.ctx, wire.NetworkRequest{Mode: *mode, Allow: *allow, Deny: *deny, Effects: effects()})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, info)
	}
	return printNetwork(e.stdout, &info)
}

func runNetShow(e *env, args []string) error {
	fs := flag.NewFlagSet("net show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	info, err := c.Sandbox(id).Network(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, info)
	}
	return printNetwork(e.stdout, &info)
}

func printNetwork(w io.Writer, info *wire.NetworkInfo) error {
	tw := newTabWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "sandbox\t%s\n", info.SandboxID)
	fmt.Fprintf(tw, "mode\t%s\n", info.Policy.Mode)
	for _, r := range info.Policy.Allow {
		fmt.Fprintf(tw, "allow\t%s\n", r)
	}
	for _, r := range info.Policy.Deny {
		fmt.Fprintf(tw, "deny\t%s\n", r)
	}
	if ef := info.Policy.Effects; ef != nil {
		for _, h := range ef.Effectful {
			fmt.Fprintf(tw, "effectful\t%s\n", h)
		}
		fmt.Fprintf(tw, "effects\tidempotency %s, repeat %s\n", or(ef.Idempotency, "keep"), or(ef.Repeat, "replay"))
	}
	if info.Attached {
		fmt.Fprintf(tw, "address\t%s\n", info.IP)
	} else {
		fmt.Fprintf(tw, "address\t(not attached: the sandbox is not running)\n")
	}
	if len(info.Secrets) > 0 {
		fmt.Fprintf(tw, "secrets\t%s\n", strings.Join(info.Secrets, ", "))
	}
	for _, p := range info.Ports {
		tok := ""
		if p.Token {
			tok = " (token)"
		}
		fmt.Fprintf(tw, "port\t%d%s\n", p.Port, tok)
	}
	return tw.Flush()
}

func runNetLog(e *env, args []string) error {
	fs := flag.NewFlagSet("net log", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output (one array)")
	limit := fs.Int("limit", 0, "at most this many entries (default all)")
	id, c, err := parseIDClient(fs, args)
	if err != nil {
		return err
	}
	all := []wire.EgressEntry{}
	var after int64
	for {
		page, err := c.Sandbox(id).EgressLog(e.ctx, after, 0)
		if err != nil {
			return err
		}
		all = append(all, page.Entries...)
		if len(page.Entries) == 0 || (*limit > 0 && len(all) >= *limit) {
			break
		}
		after = page.Next
	}
	if *limit > 0 && len(all) > *limit {
		all = all[:*limit]
	}
	if *asJSON {
		return printJSON(e.stdout, all)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tPROTO\tDESTINATION\tHOST\tVERDICT\tRULE\tOUT\tIN")
	for _, en := range all {
		dst := en.DstIP
		if dst == "" {
			dst = "-"
		} else if en.DstPort != 0 {
			dst += ":" + strconv.Itoa(en.DstPort)
		}
		verdict := en.Verdict
		if en.Reason != "" {
			verdict += " (" + en.Reason + ")"
		}
		if en.Intercepted {
			verdict += " [injected]"
		}
		// Host (a DNS name the sandbox asked for) and the rest may hold
		// terminal escapes: escaped here, exact in --json.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", en.Time.Local().Format(time.TimeOnly), printable(en.Proto), printable(dst),
			printable(en.Host), printable(verdict), printable(en.Rule), en.BytesOut, en.BytesIn)
	}
	return tw.Flush()
}

func runSecret(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"secret: expected set, ls, rm, leases or revoke"}
	}
	sub, args := args[0], args[1:]
	if sub == "leases" || sub == "revoke" {
		return runLeases(e, sub, args) // leases.go
	}
	fs := flag.NewFlagSet("secret "+sub, flag.ContinueOnError)
	host := fs.String("host", "", "the only host the secret is injected into, e.g. api.example.com")
	header := fs.String("header", "", `header template (default "Authorization: Bearer {{value}}")`)
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
	switch sub {
	case "set":
		name, err := one(fs, pos, "secret name")
		if err != nil {
			return err
		}
		if *host == "" {
			return usageError{"secret set: --host is required"}
		}
		// The value comes from stdin so it never shows in argv or shell history.
		val, err := io.ReadAll(io.LimitReader(e.stdin, 64<<10))
		if err != nil {
			return err
		}
		val = bytes.TrimRight(val, "\r\n")
		info, err := c.PutSecret(e.ctx, *own, name, wire.SecretRequest{Host: *host, Header: *header, Value: string(val)})
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, info)
		}
		fmt.Fprintf(e.stdout, "%s (injected into requests to %s as %q)\n", info.Name, info.Host, info.Header)
		return nil
	case "ls":
		list, err := c.Secrets(e.ctx, *own)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, list)
		}
		tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tHOST\tHEADER\tUPDATED")
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, s.Host, s.Header, s.UpdatedAt.Local().Format(time.RFC3339))
		}
		return tw.Flush()
	case "rm":
		name, err := one(fs, pos, "secret name")
		if err != nil {
			return err
		}
		return c.DeleteSecret(e.ctx, *own, name)
	}
	return usageError{fmt.Sprintf("secret: unknown subcommand %q (want set, ls, rm, leases or revoke)", sub)}
}

func runPort(e *env, args []string) error {
	fs := flag.NewFlagSet("port", flag.ContinueOnError)
	withToken := fs.Bool("token", false, "also let a per-port token in (printed once, part of the URL)")
	closePort := fs.Bool("close", false, "stop exposing the port")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	switch len(pos) {
	case 1:
		ports, err := c.Sandbox(pos[0]).Ports(e.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, ports)
		}
		for _, p := range ports {
			fmt.Fprintf(e.stdout, "%d\t%s\n", p.Port, p.URL)
		}
		return nil
	case 2:
	default:
		return usageError{"port: expected ID [PORT]"}
	}
	port, err := strconv.Atoi(pos[1])
	if err != nil {
		return usageError{fmt.Sprintf("port: %q is not a port number", pos[1])}
	}
	if *closePort {
		return c.Sandbox(pos[0]).ClosePort(e.ctx, port)
	}
	resp, err := c.Sandbox(pos[0]).ExposePort(e.ctx, port, *withToken)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, resp)
	}
	fmt.Fprintln(e.stdout, resp.URL)
	return nil
}
