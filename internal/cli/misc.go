package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/errs"
)

// remoteRef splits "ID:/path"; a local path has no colon before its first slash.
func remoteRef(s string) (id, path string, ok bool) {
	i := strings.Index(s, ":")
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

func runCp(e *env, args []string) error {
	fs := flag.NewFlagSet("cp", flag.ContinueOnError)
	user := fs.String("user", "", "user owning written files / reading (default: user)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{"cp: usage: berth cp SRC DST (either side may be ID:/path; - is stdin/stdout)"}
	}
	srcID, srcPath, srcRemote := remoteRef(pos[0])
	dstID, dstPath, dstRemote := remoteRef(pos[1])
	if srcRemote == dstRemote {
		return usageError{"cp: exactly one side must be ID:/path"}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	if dstRemote {
		var in io.Reader = e.stdin
		mode := os.FileMode(0o644)
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return errs.Wrap(errs.InvalidArgument, err, "cp: source")
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			if st.IsDir() {
				if strings.HasSuffix(dstPath, "/") {
					dstPath += filepath.Base(filepath.Clean(pos[0]))
				}
				return cpTreeUp(e.ctx, c.Sandbox(dstID), pos[0], dstPath, *user, e.stderr)
			}
			mode = st.Mode().Perm()
			in = f
			if strings.HasSuffix(dstPath, "/") {
				dstPath += filepath.Base(pos[0])
			}
		}
		_, err := c.Sandbox(dstID).WriteFile(e.ctx, dstPath, in, client.WriteFileOptions{User: *user, Mode: uint32(mode)})
		return err
	}
	if pos[1] != "-" {
		if st, err := c.Sandbox(srcID).Stat(e.ctx, srcPath, *user); err == nil && st.Type == "dir" {
			dst := pos[1]
			if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
				dst = filepath.Join(dst, filepath.Base(st.Path))
			}
			return cpTreeDown(e.ctx, c.Sandbox(srcID), srcPath, dst, *user, e.stderr)
		}
	}
	body, err := c.Sandbox(srcID).ReadFile(e.ctx, srcPath, *user)
	if err != nil {
		return err
	}
	defer body.Close()
	if pos[1] == "-" {
		_, err := io.Copy(e.stdout, body)
		return err
	}
	dst := pos[1]
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, filepath.Base(srcPath))
	}
	tmp := dst + ".berth-tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "cp: destination")
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		os.Remove(tmp)
		return errs.Wrap(errs.Unavailable, err, "cp: download")
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

func runEvents(e *env, args []string) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	var list []wire.Event
	switch len(pos) {
	case 0:
		list, err = c.Events(e.ctx, client.EventsOptions{})
	case 1:
		list, err = c.Sandbox(pos[0]).Events(e.ctx)
	default:
		return usageError{"events: at most one sandbox id"}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tSANDBOX\tTYPE\tFROM\tTO\tACTOR\tREASON\tMESSAGE")
	for _, ev := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.Time.Local().Format(time.DateTime), ev.SandboxID, ev.Type,
			ev.From, ev.To, ev.Actor, ev.Reason, ev.Message)
	}
	return tw.Flush()
}

func runTemplate(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"template: usage: berth template ls | import NAME FILE.tar | pull NAME IMAGE | build -t NAME CONTEXT | rm NAME"}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	switch args[0] {
	case "ls":
		fs := flag.NewFlagSet("template ls", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "JSON output")
		if _, err := parse(fs, args[1:]); err != nil {
			return err
		}
		list, err := c.Templates(e.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, list)
		}
		tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSTATE\tFINGERPRINT\tLAYERS\tSOURCE\tPROGRESS")
		for _, t := range list {
			detail := t.Progress
			if t.Error != "" {
				detail = "error: " + t.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", t.Name, t.State, t.Fingerprint, len(t.Layers), t.Source, detail)
		}
		return tw.Flush()
	case "from-snapshot":
		return templateFromSnapshot(e, c, args[1:])
	case "pull":
		return templatePull(e, c, args[1:])
	case "build":
		return templateBuild(e, c, args[1:])
	case "rm":
		return templateRm(e, c, args[1:])
	case "import":
		fs := flag.NewFlagSet("template import", flag.ContinueOnError)
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 2 {
			return usageError{"template import: usage: berth template import NAME FILE.tar"}
		}
		f, err := os.Open(pos[1])
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "template import: file")
		}
		defer f.Close()
		fmt.Fprintf(e.stderr, "importing %s as %s ...\n", pos[1], pos[0])
		t, err := c.ImportTemplate(e.ctx, pos[0], f, "import "+filepath.Base(pos[1]))
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s %s %s\n", t.Name, t.State, t.Fingerprint)
		return nil
	}
	return usageError{"template: unknown subcommand " + args[0]}
}

func runKey(e *env, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return usageError{"key: usage: berth key create --owner NAME"}
	}
	fs := flag.NewFlagSet("key create", flag.ContinueOnError)
	own := fs.String("owner", "", "owner the key acts as")
	if _, err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *own == "" {
		return usageError{"key create: --owner is required"}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	out, err := c.CreateKey(e.ctx, *own)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, out.Key)
	return nil
}

func runInfo(e *env, args []string) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	in, err := c.Info(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, in)
	}
	fmt.Fprintf(e.stdout, "berth %s on %s (%d CPUs), you are %s\n", in.Version, in.Hostname, in.CPUs, in.Owner)
	tw := newTabWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUNTIME\tDEFAULT\tISOLATION\tFREEZE\tMEMORY CHECKPOINT")
	for _, r := range in.Runtimes {
		cp := "yes"
		if !r.Checkpoint {
			cp = "no: " + r.CheckpointReason
		}
		iso := r.Isolation
		if r.UserNS != nil {
			iso += fmt.Sprintf(" (root = host uid %d)", r.UserNS.HostID)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%v\t%s\n", r.Name, r.Default, iso, r.Freeze, cp)
	}
	return tw.Flush()
}
