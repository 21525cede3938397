package cli

import (
	"archive/tar"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/errs"
)

const (
	pullUsage  = "template pull NAME IMAGE [--username U --password-stdin] [--insecure]   (IMAGE: REGISTRY/REPO[:TAG|@DIGEST] | oci-layout:DIR[:TAG] | docker-archive:FILE.tar[:TAG])"
	buildUsage = "template build -t NAME [-f Dockerfile] [--build-arg K=V]... [--network allow-all|deny-all] [--no-cache] CONTEXT"
)

func templatePull(e *env, c *client.Client, args []string) error {
	fs := flag.NewFlagSet("template pull", flag.ContinueOnError)
	user := fs.String("username", "", "registry user (basic auth)")
	pwStdin := fs.Bool("password-stdin", false, "read the registry password from stdin")
	insecure := fs.Bool("insecure", false, "plain-HTTP or self-signed registry")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{"template pull: usage: berth " + pullUsage}
	}
	req := wire.PullRequest{Image: pos[1], Username: *user, Insecure: *insecure}
	if *pwStdin {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return err
		}
		req.Password = strings.TrimRight(string(b), "\r\n")
	}
	if req.Password != "" && req.Username == "" {
		return usageError{"template pull: --password-stdin needs --username"}
	}
	start := time.Now()
	t, err := c.PullTemplate(e.ctx, pos[0], req, func(ev wire.BuildEvent) { printProgress(e.stderr, ev) })
	if err != nil {
		return err
	}
	printResult(e, t, start)
	return nil
}

func templateBuild(e *env, c *client.Client, args []string) error {
	fs := flag.NewFlagSet("template build", flag.ContinueOnError)
	name := fs.String("t", "", "template name")
	file := fs.String("f", "", "Dockerfile (default CONTEXT/Dockerfile)")
	network := fs.String("network", "", "RUN steps' egress: allow-all (default) or deny-all")
	noCache := fs.Bool("no-cache", false, "rebuild every step")
	var buildArgs multi
	fs.Var(&buildArgs, "build-arg", "NAME=VALUE for an ARG (repeatable)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *name == "" {
		return usageError{"template build: usage: berth " + buildUsage}
	}
	ctxDir := pos[0]
	if st, err := os.Stat(ctxDir); err != nil || !st.IsDir() {
		return errs.Field("context", "%s is not a directory", ctxDir)
	}
	df := "Dockerfile"
	if *file != "" {
		abs, _ := filepath.Abs(*file)
		absCtx, _ := filepath.Abs(ctxDir)
		rel, err := filepath.Rel(absCtx, abs)
		if err != nil || !filepath.IsLocal(rel) {
			return errs.Field("f", "%s must be inside the build context %s", *file, ctxDir)
		}
		df = filepath.ToSlash(rel)
	}
	o := client.BuildOptions{Dockerfile: df, BuildArgs: buildArgs, Network: *network, NoCache: *noCache}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(packContext(ctxDir, pw)) }()
	defer pr.Close()
	start := time.Now()
	t, err := c.BuildTemplate(e.ctx, *name, pr, o, func(ev wire.BuildEvent) { printProgress(e.stderr, ev) })
	if err != nil {
		return err
	}
	printResult(e, t, start)
	return nil
}

func templateRm(e *env, c *client.Client, args []string) error {
	if len(args) == 0 {
		return usageError{"template rm: usage: berth template rm NAME..."}
	}
	for _, n := range args {
		out, err := c.DeleteTemplate(e.ctx, n)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s removed (%d layers garbage-collected)\n", out.Removed, out.LayersCollected)
	}
	return nil
}

// printResult prints a pull or build's template to stdout (progress went
// to stderr as it came).
func printResult(e *env, t wire.Template, start time.Time) {
	fmt.Fprintf(e.stdout, "%s %s %s (%d layers, %s)\n", t.Name, t.State, t.Fingerprint, len(t.Layers),
		time.Since(start).Round(time.Millisecond))
}

func printProgress(w io.Writer, ev wire.BuildEvent) {
	p := ev.BuildProgress
	if p.Phase == "output" {
		io.WriteString(w, p.Output)
		return
	}
	prefix := ""
	if p.Steps > 0 {
		prefix = fmt.Sprintf("[%d/%d] ", p.Step, p.Steps)
	}
	suffix := ""
	if p.Cached != nil {
		suffix = " (cache miss)"
		if *p.Cached {
			suffix = " (cached)"
		}
	}
	if p.Bytes > 0 {
		suffix += " " + humanBytes(p.Bytes)
	}
	fmt.Fprintf(w, "%s%s: %s%s\n", prefix, p.Phase, p.Message, suffix)
}

// packContext writes dir as a tar (numeric owners, no names; sockets and
// devices left out).
func packContext(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
