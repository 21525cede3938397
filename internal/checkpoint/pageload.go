package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// pageLoader is a runtime whose Restore may return while the memory image
// is still being read (runsc restore --background, internal/runtime/oci):
// the sandbox already runs, a page it touches is loaded first, and the
// rest follows. The image must stay until the load is over; a load that
// fails kills the restored processes.
type pageLoader interface {
	// WaitPagesLoaded: nil once id's image is read (or none is being
	// read); NotFound when id was deleted meanwhile; another error when the
	// load failed.
	WaitPagesLoaded(ctx context.Context, id string) error
}

// loadingDir is where a resumed sandbox's memory image waits for its
// background load to end: out of MemoryDir, so a pause right after the
// resume writes a new image there without touching this one (the runtime
// reads it through descriptors it opened during the restore, so the
// rename does not disturb it).
func (s *Service) loadingDir(id string, count int) string {
	return s.MemoryDir(id) + ".loading" + strconv.Itoa(count)
}

// removeLoadingDirs removes the images of past resumes whose watch ended
// without removing them (the daemon stopped meanwhile); called once the
// runtime has no load of id going on.
func (s *Service) removeLoadingDirs(id string) {
	old, _ := filepath.Glob(s.MemoryDir(id) + ".loading*")
	for _, d := range old {
		_ = os.RemoveAll(d)
	}
}

// watchPageLoad follows the background load of sb's memory, restored for
// the count-th time, on the daemon's lifetime. discard, if not "", is the
// image's directory, removed once the load is over. A failed load is an
// event, and sb — if it is still running on that restore — boots again
// from its workspace (disk is the promise), or fails saying why.
func (s *Service) watchPageLoad(sb *sandbox.Sandbox, rt runtime.Runtime, count int, discard string) {
	l, ok := rt.(pageLoader)
	if !ok {
		if discard != "" {
			_ = os.RemoveAll(discard)
		}
		return
	}
	id := sb.ID
	s.core.GoBackground("page load "+id, func(bg context.Context) {
		err := l.WaitPagesLoaded(bg, id)
		if bg.Err() != nil {
			return // the daemon stops; the next pause removes the image
		}
		if discard != "" {
			_ = os.RemoveAll(discard)
		}
		if err == nil || errs.Is(err, errs.NotFound) {
			return
		}
		s.pageLoadFailed(bg, id, count, err)
	})
}

// pageLoadFailed settles a sandbox whose memory did not finish loading:
// the runtime killed its processes.
func (s *Service) pageLoadFailed(bg context.Context, id string, count int, cause error) {
	s.log.Warn("memory pages failed to load after a restore", "sandbox_id", id, "err", cause)
	unlock := s.core.Lock(id)
	defer unlock()
	ctx, cancel := teardownCtx(bg)
	defer cancel()
	cur, err := s.core.Store().GetSandbox(ctx, id)
	if err != nil {
		return
	}
	msg := "loading the memory image in the background failed after the restore: " + errs.Short(cause) + "; the runtime killed the sandbox's processes"
	data := map[string]string{"paused_with": string(sandbox.PauseMemory), "restore_count": strconv.Itoa(count)}
	if cur.State != sandbox.Running || cur.RestoreCount != count {
		// Paused (the pause found the load failed and fell back to disk),
		// deleted, failed by the PID-1 watch, or restored again since:
		// only say what happened.
		s.core.Event(ctx, cur, "berth", "resume_degraded", "memory_load_failed", msg, data)
		return
	}
	_ = s.core.Halt(ctx, cur)
	if err := s.core.Boot(ctx, cur); err != nil {
		s.core.Event(ctx, cur, "berth", "resume_degraded", "memory_load_failed", msg, data)
		s.core.Fail(ctx, cur, "resume_failed", errs.Wrap(errs.Internal, err, "boot after the memory image failed to load"))
		return
	}
	data["resumed_from"] = string(sandbox.PauseDisk)
	s.core.Event(ctx, cur, "berth", "resume_degraded", "memory_load_failed", msg+"; it was booted again from its workspace", data)
	_, _ = s.core.Store().UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		s.ResumedFrom = sandbox.PauseDisk
		s.Reason, s.Message = "memory_load_failed", msg+"; booted again from its workspace"
		return nil
	})
}

// imageReaders is a runtime that knows which memory images its restores
// still read (internal/runtime/oci).
type imageReaders interface {
	ImageReaders(imageDir string) int
}

// removeWhenUnread removes dir, which holds memory image img, once no
// runtime's restore reads img any more: at once, or in the background when
// one still loads pages from it (a fork's parent, restored from the fork's
// snapshot, which is not among the snapshot's users).
func removeWhenUnread(c Core, dir, img string) {
	reading := func() bool {
		for _, rt := range c.Runtimes() {
			if r, ok := rt.(imageReaders); ok && img != "" && r.ImageReaders(img) > 0 {
				return true
			}
		}
		return false
	}
	if !reading() {
		_ = os.RemoveAll(dir)
		return
	}
	c.GoBackground("remove "+dir, func(bg context.Context) {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for reading() {
			select {
			case <-bg.Done():
				return
			case <-t.C:
			}
		}
		_ = os.RemoveAll(dir)
	})
}
