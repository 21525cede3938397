package timeline

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// A restart (rewind, promote) sets the sandbox's workspace image aside and
// switches its layers before it starts again. The journal, written and
// synced in the sandbox's directory (the daemon's, never the sandbox's)
// before the image moves, lets a daemon that died in between settle it.
type restartJournal struct {
	Old []string `json:"old_layers"`
	New []string `json:"new_layers"`
}

func journalPath(dir string) string { return filepath.Join(dir, "timeline-restart.json") }

func writeJournal(dir string, j restartJournal) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	p := journalPath(dir)
	f, err := os.OpenFile(p+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	if err == nil {
		err = syncDir(dir)
	}
	return err
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Recover settles a restart a daemon crash interrupted (called at daemon
// start, before the sandbox is reconciled): when the sandbox's layers were
// not switched yet, its old workspace image is put back; when they were,
// the restart had committed and the old image is dropped (the sandbox then
// boots on the new layers over a fresh workspace, as the restart would
// have). Either way nothing is half. runState is the container's state as
// the caller already knows it from the runtime ("" = ask the runtime):
// daemon start lists every container at once.
func (s *Service) Recover(ctx context.Context, sb *sandbox.Sandbox, runState string) error {
	s.thawInterrupted(ctx, sb, runState)
	dir := s.core.SandboxDir(sb.ID)
	l := rootfs.LayoutOf(dir)
	aside := l.Image + ".timeline"
	b, jerr := os.ReadFile(journalPath(dir))
	_, asideErr := os.Stat(aside)
	if jerr != nil && asideErr != nil {
		return nil
	}
	var j restartJournal
	if jerr == nil {
		if err := json.Unmarshal(b, &j); err != nil {
			return errs.Wrap(errs.Internal, err, "restart journal of %s", sb.ID)
		}
	}
	committed := jerr == nil && slices.Equal(sb.Layers, j.New) && !slices.Equal(j.Old, j.New)
	if asideErr == nil {
		if committed {
			if err := os.Remove(aside); err != nil {
				return err
			}
		} else {
			_ = os.Remove(l.Image) // a fresh image a restart had begun
			if err := os.Rename(aside, l.Image); err != nil {
				return errs.Wrap(errs.Internal, err, "put the workspace of %s back", sb.ID)
			}
		}
	}
	s.log.Warn("timeline: settled an interrupted restart", "sandbox_id", sb.ID, "committed", committed)
	s.core.Event(ctx, sb, "berth", "timeline", "restart_settled", "the daemon stopped during a rewind or promote", map[string]string{
		"committed": map[bool]string{true: "true", false: "false"}[committed]})
	_ = os.Remove(journalPath(dir))
	return nil
}

// thawInterrupted thaws a running sandbox a checkpoint froze for its
// capture when the daemon died before the thaw (it would otherwise be
// taken for dead by the reconcile that follows: its agent does not
// answer). At daemon start nothing else holds a running sandbox frozen:
// interrupted merges, which freeze their targets, are settled before
// this, and a pause moves the sandbox out of running first.
func (s *Service) thawInterrupted(ctx context.Context, sb *sandbox.Sandbox, runState string) {
	if sb.State != sandbox.Running {
		return
	}
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return
	}
	if runState == "" {
		if st, err := rt.State(ctx, sb.ID); err == nil {
			runState = st.State
		}
	}
	if runState == "paused" {
		if err := rt.Thaw(ctx, sb.ID); err != nil {
			s.log.Warn("timeline: thaw a sandbox a checkpoint left frozen", "sandbox_id", sb.ID, "err", err)
			return
		}
		s.log.Warn("timeline: thawed a sandbox a checkpoint left frozen", "sandbox_id", sb.ID)
	}
}

// Sweep removes, at daemon start, what no checkpoint owns under
// <data dir>/checkpoints: a promote's scratch image, or the image of a
// checkpoint whose row was never written (a crash between the two).
func (s *Service) Sweep(ctx context.Context) error {
	dir := filepath.Join(s.cfg.DataDir, "checkpoints")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	list, err := s.core.Store().ListCheckpoints(ctx, "")
	if err != nil {
		return err
	}
	owned := map[string]bool{}
	for _, c := range list {
		owned[c.ID] = true
	}
	for _, e := range entries {
		if !owned[e.Name()] {
			s.log.Warn("timeline: removing an image no checkpoint owns", "dir", e.Name())
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}
