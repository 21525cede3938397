package merges

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// applyAgent applies a plan to a target whose tree only its agent can
// write (runsc keeps the writes in the sentry): the staged objects go to
// the agent as a tar, the agent stops every other process (a cgroup
// freeze would stop the agent too), the daemon verifies the plan against
// a fresh view, saves the journal as committing, and the agent commits
// with renames. The journal stays here; a crash is rolled back by Recover
// through the agent (/merge/finish).
func (s *Service) applyAgent(ctx context.Context, target *sandbox.Sandbox, m store.Merge, plan *merge.Plan, base, theirs []string, clk *clock) (Result, error) {
	ag := s.core.AgentClient(target.ID)
	v, err := s.openViews(ctx, nil, base, theirs)
	if err != nil {
		return Result{}, err
	}
	defer v.Close()
	res := Result{Writes: len(plan.Writes), Deletes: len(plan.Deletes)}
	j := merge.NewJournal(plan, m.ID)
	clk.mark("prepare")
	if err := s.saveJournal(j, target.ID); err != nil {
		return Result{}, err
	}
	clk.mark("journal")
	// cleanup asks the agent to undo (journal committing) or clean up and
	// resume the processes; the journal goes once the agent has done it.
	cleanup := func(cause error) error {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if ferr := ag.MergeFinish(fctx, j); ferr != nil {
			s.log.Error("merge cleanup in the agent; the journal is kept for recovery", "sandbox_id", target.ID, "merge", m.ID, "err", ferr)
			return errors.Join(cause, ferr)
		}
		_ = os.RemoveAll(s.journalDir(m.ID))
		return cause
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(merge.WriteStage(ctx, pw, j, plan, merge.Sources{merge.SideTheirs: v.theirs, merge.SideBase: v.base}))
	}()
	// berth runs runsc with --overlay2=none: the sentry writes through to
	// the host upper, so one syncfs of the workspace here makes the staged
	// files durable (the agent's syncfs would fsync them one by one).
	err = ag.MergeStage(ctx, j, pr, true)
	pr.CloseWithError(errors.New("stage request ended"))
	if err == nil {
		err = syncWorkspace(s.core.SandboxDir(target.ID))
	}
	if err != nil {
		return Result{}, cleanup(errs.Wrap(errs.KindOf(err), err, "stage merge %s in %s", m.ID, target.ID))
	}
	clk.mark("stage")
	stop, err := ag.MergeStop(ctx, plan.Touched())
	if err != nil {
		return Result{}, cleanup(err)
	}
	for _, f := range stop.OpenFiles {
		res.OpenFiles = append(res.OpenFiles, OpenFile{PID: f.PID, Cmd: f.Cmd, Path: f.Path})
	}
	clk.mark("freeze")
	fresh := &views{}
	ours, err := s.oursTree(ctx, fresh, target)
	if err == nil {
		err = merge.Verify(plan, ours)
	}
	fresh.Close()
	if err != nil {
		return Result{}, cleanup(err)
	}
	clk.mark("verify")
	j.State = merge.JournalCommitting
	if err := s.saveJournal(j, target.ID); err != nil {
		j.State = merge.JournalPrepared
		return Result{}, cleanup(err)
	}
	clk.mark("journal")
	steps := j
	if d := s.cfg.PauseAfterStep; d > 0 && len(j.Steps) > 1 {
		// Test hook: the first step alone, then the pause, then the rest.
		first := *j
		first.Steps = j.Steps[:1]
		if cr, err := ag.MergeCommit(ctx, &first); err != nil || cr.Error != "" {
			return Result{}, cleanup(errors.Join(err, errors.New(cr.Error)))
		}
		s.log.Warn("merge paused for a test (BERTH_TEST_MERGE_PAUSE)", "sandbox_id", target.ID, "merge", m.ID, "steps", len(j.Steps))
		time.Sleep(d)
		rest := *j
		rest.Steps = j.Steps[1:]
		steps = &rest
	}
	cr, err := ag.MergeCommit(ctx, steps)
	switch {
	case err != nil:
		return Result{}, cleanup(err) // journal committing: the agent rolls back
	case cr.Error != "" && cr.RolledBack:
		j.State = merge.JournalRolledBack
		_ = s.saveJournal(j, target.ID)
		return Result{}, cleanup(errs.E(errs.Internal, "merge %s rolled back in %s: %s", m.ID, target.ID, cr.Error))
	case cr.Error != "":
		return Result{}, cleanup(errs.E(errs.Internal, "merge %s failed in %s: %s", m.ID, target.ID, cr.Error))
	}
	clk.mark("commit")
	j.State = merge.JournalCommitted
	if err := s.saveJournal(j, target.ID); err != nil {
		return Result{}, err
	}
	clk.mark("journal")
	if err := cleanup(nil); err != nil {
		s.log.Warn("merge applied; cleanup in the agent failed", "sandbox_id", target.ID, "merge", m.ID, "err", err)
	}
	clk.mark("finish")
	return res, nil
}

// recoverAgent finishes an interrupted merge of a runsc target through its
// agent (its channel comes back when the agent redials the new daemon).
func (s *Service) recoverAgent(ctx context.Context, target *sandbox.Sandbox, j *merge.Journal) error {
	ag := s.core.AgentClient(target.ID)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := ag.WaitReady(wctx, 50*time.Millisecond); err != nil {
		return errs.Wrap(errs.Unavailable, err, "agent of %s for merge recovery", target.ID)
	}
	return ag.MergeFinish(wctx, j)
}

// syncWorkspace flushes the filesystem of a sandbox's workspace (its
// upper and work dirs) to disk: the workspace mount's root, a host path.
func syncWorkspace(dir string) error {
	ws := rootfs.LayoutOf(dir).WS
	fd, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open workspace %s", ws)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return errs.Wrap(errs.Internal, err, "sync workspace %s", ws)
	}
	return nil
}
