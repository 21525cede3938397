package notes

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// skipPrefixes are the sandbox's own berth plumbing, not its work.
var skipPrefixes = []string{"var/lib/berth-agent", "run/berth-agent", ".berth"}

func skipped(rel string) bool {
	if !strings.Contains(rel, "/") && strings.HasPrefix(rel, ".gvisor.filestore.") {
		return true // gVisor's filestore of its in-sandbox overlay
	}
	for _, p := range skipPrefixes {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// scanTree builds the manifest of the sandbox's own layers (the top own
// layers of tree, above the template) and finds the git repositories
// among what changed. It reads only through the fsdiff layers (beneath
// each layer's root, never following a link) and stops at
// manifestEntries paths or when ctx ends.
func scanTree(ctx context.Context, tree *fsdiff.Tree, own int) (*Manifest, []repoAt, error) {
	layers := tree.Layers()
	if own < 0 || own > len(layers) {
		own = min(1, len(layers))
	}
	base := fsdiff.NewTree(layers[own:]...)
	m := &Manifest{}
	seen := map[string]bool{}
	var paths []string
	var walk func(l fsdiff.Layer, dir string, depth int) error
	walk = func(l fsdiff.Layer, dir string, depth int) error {
		if depth > 64 {
			return nil
		}
		names, err := l.ReadDir(dir)
		if err != nil {
			return nil // gone or replaced meanwhile: a live tree
		}
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				return err
			}
			rel := name
			if dir != "." {
				rel = dir + "/" + name
			}
			if skipped(rel) {
				continue
			}
			if !seen[rel] {
				if len(paths) >= manifestEntries {
					m.Truncated = true
					return nil
				}
				seen[rel] = true
				paths = append(paths, rel)
			}
			e, ok, err := l.Lstat(rel)
			if err != nil || !ok {
				continue
			}
			if e.Type == fsdiff.TypeDir && !e.Whiteout {
				if err := walk(l, rel, depth+1); err != nil {
					return err
				}
				if m.Truncated {
					return nil
				}
			}
		}
		return nil
	}
	for _, l := range layers[:own] {
		if err := walk(l, ".", 0); err != nil {
			return m, nil, err
		}
		if m.Truncated {
			break
		}
	}
	sort.Strings(paths)
	hashed := int64(0)
	var repos []repoAt
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return m, repos, err
		}
		n, ok, err := tree.Lookup(p)
		if err != nil {
			continue
		}
		_, inBase, _ := base.Lookup(p)
		if path.Base(p) == ".git" && ok {
			repos = append(repos, repoAt{dir: path.Dir(p), link: n.Type == fsdiff.TypeSymlink})
		}
		switch {
		case !ok && inBase:
			m.Entries = append(m.Entries, Entry{Path: p, Type: whiteout, Base: true})
			continue
		case !ok || n.Type == fsdiff.TypeDir:
			continue
		}
		e := Entry{Path: p, Type: string(n.Type), Size: n.Size, Target: clip(n.Target, MaxLine), Base: inBase}
		if n.Type == fsdiff.TypeFile && n.Size <= hashMax && hashed+n.Size <= hashBudget {
			if sum, err := tree.Hash(p); err == nil {
				e.Sum = sum
				hashed += n.Size
			}
		}
		m.Entries = append(m.Entries, e)
	}
	repos = append(repos, reposAbove(tree, m, repos)...)
	return m, repos, nil
}

// repoAt is a repository found in the workspace: its directory (relative
// to the root) and whether its .git is a symbolic link (never followed,
// never handed to git).
type repoAt struct {
	dir  string
	link bool
}

// reposAbove finds the repositories that hold changed files although
// their .git is the template's (a repository of the template edited in
// the sandbox): each changed path's ancestors are looked up, at most
// maxLookups in all.
func reposAbove(tree *fsdiff.Tree, m *Manifest, known []repoAt) []repoAt {
	const maxLookups = 2000
	checked := map[string]bool{}
	for _, r := range known {
		checked[r.dir] = true
	}
	var out []repoAt
	lookups := 0
	for _, e := range m.Entries {
		for d := path.Dir(e.Path); ; d = path.Dir(d) {
			if checked[d] || lookups >= maxLookups {
				break
			}
			checked[d] = true
			lookups++
			g := ".git"
			if d != "." {
				g = d + "/.git"
			}
			if n, ok, err := tree.Lookup(g); err == nil && ok {
				out = append(out, repoAt{dir: d, link: n.Type == fsdiff.TypeSymlink})
				break
			}
			if d == "." {
				break
			}
		}
		if lookups >= maxLookups {
			break
		}
	}
	return out
}

// gitScript reports each repository given as an argument in sections
// marked by a record separator; the host parses it as hostile text.
// GIT_OPTIONAL_LOCKS=0 keeps `git status` from writing the index; the
// -c options keep a repository's config from running hooks or a monitor.
const gitScript = `g() { git -c safe.directory='*' -c core.fsmonitor= -c core.hooksPath=/dev/null "$@"; }
for d; do
  printf '\036R\n'
  cd "/$d" 2>/dev/null || { printf '\036E\ncannot enter the directory\n'; continue; }
  printf '\036B\n'; g symbolic-ref --short -q HEAD 2>/dev/null || echo '(detached)'
  printf '\036H\n'; g rev-parse --short HEAD 2>/dev/null
  printf '\036S\n'; g status --porcelain=v1 -uall 2>&1 | awk 'NR<=50{print} END{print "\036N " NR}'
  printf '\036U\n'
  if g rev-parse -q --verify '@{upstream}' >/dev/null 2>&1; then g log --oneline '@{upstream}..HEAD' 2>/dev/null
  else g log --oneline HEAD --not --remotes 2>/dev/null; fi | awk 'NR<=50{print} END{print "\036N " NR}'
done
`

// gitState asks the sandbox's git, through the agent, for the state of
// repos (at most MaxRepos): one exec, killed at the deadline of ctx, its
// output read up to MaxGitOutput bytes.
func gitState(ctx context.Context, ag *agentapi.Client, repos []repoAt) ([]Repo, error) {
	out := make([]Repo, 0, len(repos))
	var args []string
	var asked []int
	for _, r := range repos {
		p := "/" + r.dir
		if r.dir == "." {
			p = "/"
		}
		rp := Repo{Path: clip(p, MaxLine)}
		if r.link {
			rp.Error = ".git is a symbolic link: not followed"
		} else {
			args = append(args, r.dir)
			asked = append(asked, len(out))
		}
		out = append(out, rp)
	}
	if len(args) == 0 {
		return out, nil
	}
	timeout := 1500 * time.Millisecond
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl) - 50*time.Millisecond
	}
	if timeout < 100*time.Millisecond {
		return out, errs.E(errs.Unavailable, "no time left for git")
	}
	st, err := ag.Exec(ctx, agentapi.ExecRequest{
		Argv:      append([]string{"/bin/sh", "-c", gitScript, "berth-note"}, args...),
		Env:       map[string]string{"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_PAGER": "cat"},
		Tag:       "berth-note",
		TimeoutMs: timeout.Milliseconds(),
	}, 0)
	if err != nil {
		return out, err
	}
	defer st.Close()
	var buf bytes.Buffer
	var runErr error
read:
	for {
		ev, err := st.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				runErr = err
			}
			break
		}
		switch ev.Type {
		case "stdout":
			if room := MaxGitOutput - buf.Len(); room > 0 {
				buf.Write(ev.Data[:min(len(ev.Data), room)])
			}
			if buf.Len() >= MaxGitOutput {
				runErr = errs.E(errs.ResourceExhausted, "git's answer exceeded %d bytes: cut", MaxGitOutput)
				break read
			}
		case "exit":
			if ev.Error == "timeout" {
				runErr = errs.E(errs.Unavailable, "git did not answer within %s", timeout.Round(time.Millisecond))
			}
			break read
		case "error":
			runErr = errs.E(errs.Unavailable, "git: %s", clip(ev.Error, MaxLine))
			break read
		}
	}
	parsed := parseGit(buf.Bytes())
	for i, idx := range asked {
		if i < len(parsed) {
			p := parsed[i]
			p.Path = out[idx].Path
			out[idx] = p
		} else if out[idx].Error == "" {
			out[idx].Error = "no answer from git"
		}
	}
	return out, runErr
}

// parseGit reads gitScript's sections. Lines are clipped, counts bounded;
// what does not parse is ignored (a sandbox can print anything).
func parseGit(b []byte) []Repo {
	var out []Repo
	var cur *Repo
	section := byte(0)
	for _, raw := range bytes.Split(b, []byte("\n")) {
		line := string(raw)
		if len(line) >= 2 && line[0] == '\036' {
			if line[1] == 'N' && cur != nil {
				n, _ := strconv.Atoi(strings.TrimSpace(line[2:]))
				n = max(0, min(n, 1<<30))
				switch section {
				case 'S':
					cur.DirtyTotal = n
				case 'U':
					cur.UnpushedTotal = n
				}
				continue
			}
			section = line[1]
			if section == 'R' {
				if len(out) >= MaxRepos {
					break
				}
				out = append(out, Repo{})
				cur = &out[len(out)-1]
			}
			continue
		}
		if cur == nil || line == "" {
			continue
		}
		l := clip(line, MaxLine)
		switch section {
		case 'B':
			if cur.Branch == "" {
				cur.Branch = l
			}
		case 'H':
			if cur.Head == "" {
				cur.Head = l
			}
		case 'S':
			if len(cur.Dirty) < MaxRepoLines {
				cur.Dirty = append(cur.Dirty, l)
			}
		case 'U':
			if len(cur.Unpushed) < MaxRepoLines {
				cur.Unpushed = append(cur.Unpushed, l)
			}
		case 'E':
			if cur.Error == "" {
				cur.Error = l
			}
		}
	}
	for i := range out {
		out[i].DirtyTotal = max(out[i].DirtyTotal, len(out[i].Dirty))
		out[i].UnpushedTotal = max(out[i].UnpushedTotal, len(out[i].Unpushed))
	}
	return out
}

// processes is the agent's process list, bounded (the note's own git
// exec left out; environments never kept: they may hold secrets).
func processes(ctx context.Context, ag *agentapi.Client) ([]Process, error) {
	list, err := ag.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := []Process{}
	for _, p := range list {
		if p.Tag == "berth-note" {
			continue
		}
		if len(out) >= MaxProcesses {
			break
		}
		argv := make([]string, 0, min(len(p.Argv), MaxArgv))
		for _, a := range p.Argv[:min(len(p.Argv), MaxArgv)] {
			argv = append(argv, clip(a, MaxArg))
		}
		out = append(out, Process{Pid: p.Pid, Tag: clip(p.Tag, MaxArg), Argv: argv, Cwd: clip(p.Cwd, MaxLine),
			User: clip(p.User, MaxArg), Start: p.Start})
	}
	return out, nil
}
