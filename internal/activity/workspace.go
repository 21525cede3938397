package activity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/safefs"
)

// Workspace sampling: every sampleEvery the writer's companion loop scans
// the overlay upper directory of each running sandbox from the host (runc,
// and runsc with --overlay2=none: both write there) and records the files
// whose inode changed since the previous scan. The scan is bounded
// (scanBudget entries, maxDepth levels), never follows a path the sandbox
// chose (safefs: every directory is opened beneath the upper with no
// symlinks; entries are lstat'ed relative to their directory), and
// rate-limited: at most sampleListed changes per sandbox and scan become
// entries, the rest are counted in the last one's More. It asks nothing of
// the agent, so it holds no stream open that the reaper would read as a
// client. ctime, not mtime, decides: a sandbox can set a file's mtime, not
// its ctime.
const (
	sampleEvery  = 5 * time.Second
	scanBudget   = 4096
	maxDepth     = 32
	sampleListed = 10
	readDirChunk = 256
)

// Change is one sampled workspace change.
type Change struct {
	Path  string
	Op    string // "write" (a regular file or symlink changed), "remove" (a whiteout)
	Size  int64
	Ctime time.Time
}

// ScanUpper walks the upper directory root for entries whose ctime is after
// since, visiting at most budget entries. It returns the changes (newest
// last), how many it saw in all (changes may be capped by the caller) and
// whether the budget cut the walk short.
func ScanUpper(root *safefs.Root, since time.Time, budget int) (changes []Change, truncated bool) {
	visited := 0
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > maxDepth || truncated {
			return
		}
		f, err := root.OpenDir(dir)
		if err != nil {
			return // swapped for a symlink, removed, ...: refused, skipped
		}
		defer f.Close()
		dirfd := int(f.Fd())
		for {
			ents, err := f.ReadDir(readDirChunk)
			for _, e := range ents {
				if visited >= budget {
					truncated = true
					return
				}
				visited++
				var st unix.Stat_t
				if unix.Fstatat(dirfd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
					continue
				}
				p := path.Join(dir, e.Name())
				ctime := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFDIR:
					walk(p, depth+1)
				case unix.S_IFREG, unix.S_IFLNK:
					if ctime.After(since) {
						changes = append(changes, Change{Path: p, Op: "write", Size: st.Size, Ctime: ctime})
					}
				case unix.S_IFCHR:
					if st.Rdev == 0 && ctime.After(since) { // an overlayfs whiteout
						changes = append(changes, Change{Path: p, Op: "remove", Ctime: ctime})
					}
				}
			}
			if errors.Is(err, io.EOF) || err != nil || len(ents) == 0 {
				return
			}
		}
	}
	walk("/", 0)
	sort.SliceStable(changes, func(i, j int) bool { return changes[i].Ctime.Before(changes[j].Ctime) })
	return changes, truncated
}

// sampleOne scans one sandbox's upper and records what changed since its
// previous scan; it returns the time the next scan compares with. A panic
// on what a sandbox planted costs that scan, never the daemon.
func (s *Service) sampleOne(id, upper string, since time.Time) (next time.Time) {
	started := time.Now()
	defer func() {
		if r := recover(); r != nil {
			s.cfg.Log.Error("workspace sample panicked", "sandbox_id", id, "err", fmt.Sprint(r))
			next = started
		}
	}()
	root, err := safefs.OpenRoot(upper)
	if err != nil {
		return since // not mounted (stopped meanwhile): try again later
	}
	defer root.Close()
	changes, truncated := ScanUpper(root, since, scanBudget)
	more := int64(0)
	if len(changes) > sampleListed {
		more = int64(len(changes) - sampleListed)
		changes = changes[len(changes)-sampleListed:] // the newest
	}
	for i, c := range changes {
		d := Data{Op: c.Op, Path: clip(c.Path, maxString), Size: c.Size, Source: "workspace"}
		if i == len(changes)-1 {
			d.More = more
			if truncated {
				d.Error = "scan budget reached; deeper changes not sampled"
			}
		}
		s.Record(id, KindFile, "sandbox", c.Ctime, d)
	}
	return started
}

// sample runs the workspace sampler until ctx ends.
func (s *Service) sample(ctx context.Context) {
	if s.core == nil {
		return
	}
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	// last is each sandbox's previous scan; it is kept while the sandbox
	// is paused or stopped (nothing changes then) and dropped when the
	// sandbox has not been seen running for a day.
	type scan struct{ at, seen time.Time }
	last := map[string]scan{}
	begun := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sbs, err := s.core.Running(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for _, sb := range sbs {
			prev, ok := last[sb.ID]
			if !ok {
				// First sight: changes since it started, or since this
				// sampler began (what a restarted daemon did not see
				// happen is not sampled again).
				prev.at = begun
				if sb.StartedAt.After(begun) {
					prev.at = sb.StartedAt
				}
			}
			last[sb.ID] = scan{at: s.sampleOne(sb.ID, s.core.UpperDir(sb.ID), prev.at), seen: now}
		}
		for id, sc := range last {
			if now.Sub(sc.seen) > 24*time.Hour {
				delete(last, id)
			}
		}
	}
}
