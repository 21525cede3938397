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
	sampleEvery = 5 * time.Second
	// sampleMaxGap bounds how far apart a quiet sandbox's scans drift: each
	// scan that finds nothing doubles the gap to the next, up to this; a
	// change found, an entry recorded for the sandbox (an exec, a file
	// through the API) or a return to running brings it back to
	// sampleEvery. At 1,000 idle sandboxes the scans every 5 s were the
	// largest of an idle daemon's loops. What a quiet sandbox writes is
	// still found (the next scan compares with the last one made) and
	// carries its own ctime; it only shows up to sampleMaxGap later.
	sampleMaxGap = 40 * time.Second
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
// found reports whether the scan saw any change.
func (s *Service) sampleOne(id, upper string, since time.Time) (next time.Time, found bool) {
	started := time.Now()
	defer func() {
		if r := recover(); r != nil {
			s.cfg.Log.Error("workspace sample panicked", "sandbox_id", id, "err", fmt.Sprint(r))
			next, found = started, true
		}
	}()
	root, err := safefs.OpenRoot(upper)
	if err != nil {
		return since, false // not mounted (stopped meanwhile): try again later
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
		s.record(id, KindFile, "sandbox", c.Ctime, d)
	}
	return started, len(changes) > 0
}

// sampleSchedule is one sandbox's scan schedule (the sampler's goroutine only).
type sampleSchedule struct {
	at   time.Time     // the last scan's start: the next one reports changes after it
	seen time.Time     // the last tick that found the sandbox running
	gap  time.Duration // from the last scan to the next (sampleEvery … sampleMaxGap); 0 before the first
	next time.Time
}

// due reports whether the tick at now scans: the first time, when the gap
// has passed, when an entry was recorded for the sandbox (poked), and when
// it was not running at the previous tick (resumed, restarted).
func (c sampleSchedule) due(now time.Time, poked bool) bool {
	return c.gap == 0 || poked || now.Sub(c.seen) > 2*sampleEvery || !now.Before(c.next)
}

// scanned is the schedule after a scan at now that started at at; busy: it
// found changes, or the sandbox was poked.
func (c sampleSchedule) scanned(now, at time.Time, busy bool) sampleSchedule {
	gap := sampleEvery
	if !busy && c.gap != 0 && now.Sub(c.seen) <= 2*sampleEvery {
		gap = min(2*c.gap, sampleMaxGap)
	}
	// Half a tick of slack: the ticker fires every sampleEvery, so a gap
	// of k ticks falls due on the k-th.
	return sampleSchedule{at: at, seen: now, gap: gap, next: now.Add(gap - sampleEvery/2)}
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
	last := map[string]sampleSchedule{}
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
		nudged := s.takeNudged()
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
			_, poked := nudged[sb.ID]
			if !prev.due(now, poked) {
				prev.seen = now
				last[sb.ID] = prev
				continue
			}
			at, found := s.sampleOne(sb.ID, s.core.UpperDir(sb.ID), prev.at)
			last[sb.ID] = prev.scanned(now, at, found || poked)
		}
		for id, sc := range last {
			if now.Sub(sc.seen) > 24*time.Hour {
				delete(last, id)
			}
		}
	}
}
