package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/leases"
	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/trace"
)

// MemoryDir is where a sandbox's memory image is kept while it is paused.
func (s *Service) MemoryDir(id string) string { return filepath.Join(s.core.SandboxDir(id), "memory") }

// MemoryPauseSupported reports whether a runtime can take memory checkpoints here.
func (s *Service) MemoryPauseSupported(runtimeName string) bool {
	rt, ok := s.core.Runtimes()[runtimeName]
	return ok && rt.Capabilities(s.cfg.Lifetime).Checkpoint
}

// DefaultRuntime is the runtime of a create that names none: def, except
// that a workstation (which lives through pauses) gets runsc when def
// cannot take memory checkpoints here and runsc can.
func (s *Service) DefaultRuntime(ctx context.Context, def string, workstation bool) string {
	if !workstation || def == "runsc" {
		return def
	}
	rts := s.core.Runtimes()
	alt, ok := rts["runsc"]
	if !ok {
		return def
	}
	return workstationRuntime(def, rts[def].Capabilities(ctx).Checkpoint, alt.Capabilities(ctx).Checkpoint)
}

// DefaultMode is the pause mode of a request that names none: memory when
// sb's runtime can checkpoint here, else disk.
func (s *Service) DefaultMode(sb *sandbox.Sandbox) sandbox.PauseMode {
	return defaultMode(s.MemoryPauseSupported(sb.Runtime))
}

// Pause suspends a running sandbox. mode "" picks memory when the runtime can, else disk.
func (s *Service) Pause(ctx context.Context, owner, id string, mode sandbox.PauseMode) (*sandbox.Sandbox, error) {
	return s.PauseAs(ctx, owner, id, mode, owner, "paused")
}

// PauseAs is Pause on behalf of actor (the reaper, expiry) with reason.
func (s *Service) PauseAs(ctx context.Context, owner, id string, mode sandbox.PauseMode, actor, reason string) (_ *sandbox.Sandbox, err error) {
	ctx, span := trace.Phase(ctx, "sandbox.pause")
	defer span.EndErr(&err)
	ph := phases.Start("pause")
	defer func() { ph.Log(ctx, s.log, id, err) }()
	unlock := s.core.Lock(id)
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	ph.Mark("lock")
	sb, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	ph.Mark("lookup")
	if mode == "" {
		mode = s.DefaultMode(sb)
	}
	span.Set(append(trace.Sandbox(sb), trace.String("pause.requested", string(mode)))...)
	if err := sandbox.ValidPauseMode(mode); err != nil {
		return nil, err
	}
	if sb.State != sandbox.Running {
		return nil, &sandbox.TransitionError{From: sb.State, To: sandbox.Paused}
	}
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return nil, err
	}
	// The hooks (the handoff note: the agent's processes, a scan of the
	// upper, its own commit) run beside the intent's commit, still under
	// the sandbox's lock and before anything is frozen: the note needs the
	// agent, and neither step reads what the other writes. Each was about
	// a third of a freeze pause.
	hooked := make(chan time.Duration, 1)
	go func() {
		t := time.Now()
		_ = s.cfg.Hooks.Fire(ctx, statehook.Event{Phase: statehook.BeforePause, Sandbox: sb, Actor: actor})
		hooked <- time.Since(t)
	}()
	// Intent before effect: a crash while pausing is resolved by ReconcilePaused.
	_, err = s.core.Transition(ctx, id, sandbox.Pausing, actor, reason, "", func(s *sandbox.Sandbox) error {
		s.PauseRequested = mode
		return nil
	})
	ph.Mark("intent_write")
	ph.Add("hooks_before", <-hooked)
	ph.Mark("hooks_before_wait")
	if err != nil {
		return nil, err
	}
	s.notifyPaused(id)
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	start := time.Now()
	actual, why := mode, ""
	var release func(context.Context) error
	switch mode {
	case sandbox.PauseFreeze:
		if err := trace.Do(tctx, "pause.freeze", func(ctx context.Context) error { return rt.Freeze(ctx, id) }); err != nil {
			// Fall back to a disk pause: still honest, still keeps every file.
			actual, why = sandbox.PauseDisk, "freeze failed: "+errs.Short(err)
		}
	case sandbox.PauseMemory:
		if why = memoryRefusal(sb.Runtime, rt.Capabilities(tctx)); why != "" {
			actual = sandbox.PauseDisk
		} else if release, err = s.boundedCheckpoint(tctx, sb); err != nil {
			actual, why = sandbox.PauseDisk, errs.Short(err)
			s.log.WarnContext(ctx, "checkpoint failed", "sandbox_id", id, "err", err)
		}
	}
	if actual == sandbox.PauseDisk {
		// On a context of its own: a checkpoint that hung must not have used
		// up the time the disk pause needs.
		if err := trace.Do(ctx, diskPhase(why), func(ctx context.Context) error { return s.haltForDisk(ctx, sb) }); err != nil {
			return nil, s.pauseRefused(ctx, sb, actor, mode, why, err)
		}
	}
	ph.Mark(string(actual))
	if why != "" {
		s.core.Event(tctx, sb, "berth", "pause_degraded", "fallback_to_disk", why,
			map[string]string{"requested": string(mode), "actual": string(actual)})
		s.log.WarnContext(ctx, "pause degraded", "sandbox_id", id, "requested", mode, "actual", actual, "reason", why)
	}
	span.Set(trace.String("pause.actual", string(actual)), trace.String("pause.reason", why))
	out, err := s.core.Transition(tctx, id, sandbox.Paused, actor, reason, why, func(s *sandbox.Sandbox) error {
		s.PauseActual = actual
		s.PauseMillis = time.Since(start).Milliseconds()
		return nil
	})
	ph.Mark("state_write")
	if err == nil {
		_ = s.cfg.Hooks.Fire(tctx, statehook.Event{Phase: statehook.Paused, Sandbox: out, Actor: actor})
		ph.Mark("hooks_after")
	}
	if release != nil {
		// The image is durable and the processes are gone (RAM freed): answer
		// now and release the filesystem and network in the background, still
		// holding the sandbox's lock so a resume waits for it. A crash
		// meanwhile is settled by ReconcilePaused.
		handedOff = true
		s.core.GoBackground("release "+id, func(bg context.Context) {
			defer unlock()
			rctx, cancel := teardownCtx(bg)
			defer cancel()
			if err := release(rctx); err != nil {
				s.log.Warn("release after checkpoint", "sandbox_id", id, "err", err)
			}
		})
	}
	return out, err
}

// checkpointTimeout bounds one checkpoint or restore of sb: a base plus a
// share per GiB of its memory limit (the image is at most that big).
func (s *Service) checkpointTimeout(sb *sandbox.Sandbox) time.Duration {
	return Timeout(s.cfg.CheckpointTimeout, s.cfg.CheckpointTimeoutPerGiB, sb.Resources.MemoryMiB)
}

// boundedCheckpoint is checkpoint within checkpointTimeout. On failure or
// timeout the runtime's helpers are gone (killed as a process group), the
// sandbox's processes are thawed and its agent is told to listen again;
// the error says what happened, for the pause_degraded event.
func (s *Service) boundedCheckpoint(ctx context.Context, sb *sandbox.Sandbox) (_ func(context.Context) error, err error) {
	ctx, span := trace.Phase(ctx, "pause.checkpoint")
	defer span.EndErr(&err)
	limit := s.checkpointTimeout(sb)
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	release, err := s.checkpoint(cctx, sb)
	if err == nil {
		return release, nil
	}
	timedOut := cctx.Err() != nil
	s.thawAfterCheckpoint(ctx, sb)
	if timedOut {
		return nil, fmt.Errorf("memory checkpoint did not finish within %s (checkpoint_timeout + checkpoint_timeout_per_gib × %d MiB); the runtime's checkpoint helper was killed: %w", limit, sb.Resources.MemoryMiB, err)
	}
	return nil, fmt.Errorf("memory checkpoint failed: %w", err)
}

// thawAfterCheckpoint undoes what a failed checkpoint may have left: CRIU
// freezes the cgroup and the agent closed its socket to quiesce. It runs on
// a fresh context, since the checkpoint's may be used up.
func (s *Service) thawAfterCheckpoint(ctx context.Context, sb *sandbox.Sandbox) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = rt.Thaw(fctx, sb.ID)
	_ = rt.Kill(fctx, sb.ID, syscall.SIGUSR2)
}

// haltForDisk stops a sandbox's processes for a disk pause, keeping its
// workspace, on fresh contexts (one retry).
func (s *Service) haltForDisk(ctx context.Context, sb *sandbox.Sandbox) error {
	var err error
	for range 2 {
		hctx, cancel := teardownCtx(ctx)
		err = s.core.Halt(hctx, sb)
		cancel()
		if err == nil {
			return nil
		}
		s.log.Warn("halt for a disk pause", "sandbox_id", sb.ID, "err", err)
	}
	return err
}

// pauseRefused settles a pause that could not even stop the sandbox: it is
// booted again from its intact workspace and ends running, with an event
// saying why; only a workspace that cannot boot ends failed (with how to
// recover). The returned error answers the pause request.
func (s *Service) pauseRefused(ctx context.Context, sb *sandbox.Sandbox, actor string, mode sandbox.PauseMode, why string, cause error) error {
	fctx, cancel := teardownCtx(ctx)
	defer cancel()
	msg := "could not stop the sandbox for a disk pause: " + errs.Short(cause)
	if why != "" {
		msg = why + "; then " + msg
	}
	_ = s.core.Halt(fctx, sb)
	if err := s.core.Boot(fctx, sb); err != nil {
		s.core.Fail(fctx, sb, "pause_failed", errors.Join(cause, err))
		return errs.Wrap(errs.Internal, err, "pause sandbox %s", sb.ID)
	}
	s.core.Event(fctx, sb, "berth", "pause_refused", "pause_failed", msg+"; it was booted again from its workspace",
		map[string]string{"requested": string(mode)})
	if _, err := s.core.Transition(fctx, sb.ID, sandbox.Running, actor, "pause_refused", msg, nil); err != nil {
		return err
	}
	return errs.Wrap(errs.Unavailable, cause, "pause sandbox %s refused (it is running again)", sb.ID)
}

// checkpoint quiesces the agent (it closes its host socket, which gVisor
// cannot save), writes the memory image to a temp dir and renames it into
// place, so a crash leaves either no image or a complete one.
func (s *Service) checkpoint(ctx context.Context, sb *sandbox.Sandbox) (release func(context.Context) error, err error) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return nil, err
	}
	final, tmp := s.MemoryDir(sb.ID), s.MemoryDir(sb.ID)+".tmp"
	_ = os.RemoveAll(tmp)
	_ = os.RemoveAll(final)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	if err := s.quiesceAgent(ctx, sb.ID); err != nil {
		_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
		return nil, fmt.Errorf("quiesce agent: %w", err)
	}
	if err := rt.Checkpoint(ctx, sb.ID, tmp); err != nil {
		// The caller thaws the container and lets the agent listen again.
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	// The runtime's Checkpoint waited for any background page load of
	// sb: images of past resumes still here are read by nothing.
	s.removeLoadingDirs(sb.ID)
	if err := syncDir(filepath.Dir(final)); err != nil {
		return nil, err
	}
	// The container is gone; what remains is releasing its filesystem (the
	// workspace image stays) and its network: restore attaches a fresh
	// namespace (CRIU leaves its network-lock table in the old one, and a
	// restore there fails).
	return func(ctx context.Context) error {
		s.core.DropChannel(sb.ID)
		_ = rt.Delete(ctx, sb.ID)
		if err := s.core.NetDown(ctx, sb); err != nil {
			s.log.Warn("detach network after checkpoint", "sandbox_id", sb.ID, "err", err)
		}
		return s.core.TeardownRoot(ctx, s.core.SandboxDir(sb.ID))
	}, nil
}

// quiesceAgent asks the agent to close its channel session and stop
// dialing (gVisor cannot checkpoint a connected host socket, nor CRIU an
// external one) and waits until the session is gone: its acknowledgement.
func (s *Service) quiesceAgent(ctx context.Context, id string) error {
	ch, err := s.core.Channel(id)
	if err != nil {
		return err
	}
	return ch.Quiesce(ctx, 5*time.Second)
}

// Resume brings a paused sandbox back. A memory image that cannot be
// restored falls back to a cold boot from the workspace, with an event.
func (s *Service) Resume(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return s.ResumeAs(ctx, owner, id, owner, false)
}

// ResumeCold resumes ignoring any memory image (E2B's connect {"memory":false}).
func (s *Service) ResumeCold(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return s.ResumeAs(ctx, owner, id, owner, true)
}

// ResumeAs is Resume on behalf of actor (auto-resume); cold ignores any
// memory image.
func (s *Service) ResumeAs(ctx context.Context, owner, id, actor string, cold bool) (_ *sandbox.Sandbox, err error) {
	ctx, span := trace.Phase(ctx, "sandbox.resume", trace.Bool("resume.cold", cold))
	defer span.EndErr(&err)
	ph := phases.Start("resume")
	defer func() { ph.Log(ctx, s.log, id, err) }()
	unlock := s.core.Lock(id)
	defer unlock()
	ph.Mark("lock")
	sb, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	ph.Mark("lookup")
	span.Set(append(trace.Sandbox(sb), trace.String("resume.paused_with", string(sb.PauseActual)))...)
	if sb.State == sandbox.Failed {
		if _, err := os.Stat(filepath.Join(s.core.SandboxDir(id), "disk.img")); err == nil {
			return nil, errs.Wrap(errs.Conflict, &sandbox.TransitionError{From: sb.State, To: sandbox.Running},
				"sandbox %s is failed (%s), not paused; %s", id, sb.Reason, recoverHint(id))
		}
	}
	if sb.State != sandbox.Paused {
		return nil, &sandbox.TransitionError{From: sb.State, To: sandbox.Running}
	}
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return nil, err
	}
	from, restores := sb.PauseActual, sb.RestoreCount
	thaw, restore, why := resumeFrom(sb.PauseActual, cold)
	// The lease reissue is planned (store reads) during the intent's commit
	// and the thaw, and written in the transition to running below: one
	// commit, not two. A thaw's files are written during the thaw (they
	// name no lease until that commit: the proxy refuses them), not beside
	// a commit: ext4 renames wait on its fsync. A boot rewrites env.json,
	// so its files are written beside the commit.
	writeFiles := make(chan bool, 1)
	reissue := s.planReissue(context.WithoutCancel(ctx), sb, actor, writeFiles)
	defer func() { // a failed resume still waits for its reads
		select {
		case writeFiles <- false:
		default:
		}
		reissue()
	}()
	// The Resuming intent stays even for a thaw, where it costs a commit
	// (1-1.5 ms) next to a 0.2 ms thaw: the activity timeline and the
	// events classify a resume by its resuming → running transition.
	if _, err := s.core.Transition(ctx, id, sandbox.Resuming, actor, "resuming", "", nil); err != nil {
		return nil, err
	}
	writeFiles <- thaw
	ph.Mark("intent_write")
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if why != "" {
		from = sandbox.PauseDisk
	}
	switch {
	case thaw:
		if err := trace.Do(tctx, "resume.thaw", func(ctx context.Context) error { return rt.Thaw(ctx, id) }); err != nil {
			from, why = sandbox.PauseDisk, "thaw failed: "+errs.Short(err)
		}
	case restore:
		if err := trace.Do(tctx, "resume.restore", func(ctx context.Context) error { return s.restore(ctx, sb, restores+1) }); err != nil {
			from, why = sandbox.PauseDisk, "memory restore failed: "+errs.Short(err)
			s.log.WarnContext(ctx, "restore failed", "sandbox_id", id, "err", err)
		} else {
			restores++
		}
	}
	if from == sandbox.PauseDisk || from == "" {
		from = sandbox.PauseDisk
		// A fresh context: a restore that hung must not starve the cold boot.
		bctx, bcancel := teardownCtx(ctx)
		defer bcancel()
		_ = s.core.Halt(bctx, sb)
		if err := trace.Do(bctx, "resume.boot", func(ctx context.Context) error { return s.core.Boot(ctx, sb) }); err != nil {
			s.core.Fail(bctx, sb, "resume_failed", err)
			return nil, err
		}
	}
	ph.Mark(string(from))
	_ = os.RemoveAll(s.MemoryDir(id))
	ph.Mark("cleanup")
	if why != "" && sb.PauseActual != sandbox.PauseDisk {
		s.core.Event(tctx, sb, "berth", "resume_degraded", "cold_boot", why,
			map[string]string{"paused_with": string(sb.PauseActual), "resumed_from": string(from)})
	}
	span.Set(trace.String("resume.from", string(from)), trace.String("resume.reason", why))
	plan := reissue()
	ph.Mark("lease_plan_wait")
	if plan.err != nil {
		s.log.WarnContext(ctx, "lease reissue not planned ahead; the resumed hook does it", "sandbox_id", id, "err", plan.err)
	}
	if plan.wrote && from == sandbox.PauseDisk {
		plan.wrote = false // the thaw failed and the boot wrote env.json
	}
	out, folded, fileErr, err := s.commitResume(tctx, id, actor, why, plan, func(s *sandbox.Sandbox) {
		s.ResumedFrom = from
		s.RestoreCount = restores
	})
	ph.Mark("state_write")
	if err == nil {
		ev := statehook.Event{Phase: statehook.Resumed, Sandbox: out, Actor: actor, LeasesReissued: folded}
		_ = s.cfg.Hooks.Fire(tctx, ev)
		if folded && plan.re != nil {
			// The files' failure leaves the old placeholders, now revoked:
			// the proxy refuses them (fail closed), and the error is said.
			if err := errors.Join(fileErr, plan.re.Committed(tctx, out)); err != nil {
				s.cfg.Hooks.Report(tctx, ev, "leases", err)
			}
		}
		ph.Mark("hooks_after")
	}
	return out, err
}

// leasePlan is a resume's lease reissue planned ahead (planReissue).
type leasePlan struct {
	re      *leases.Reissue // nil: nothing to reissue (when err is nil and planned)
	planned bool            // a Config.Leases planned it
	wrote   bool            // its files are written (fileErr says how)
	fileErr error
	err     error
}

// planReissue starts planning sb's lease reissue (Config.Leases), writes
// its files when write says true (once), and returns a function that
// waits for both.
func (s *Service) planReissue(ctx context.Context, sb *sandbox.Sandbox, actor string, write <-chan bool) func() leasePlan {
	if s.cfg.Leases == nil {
		return func() leasePlan { return leasePlan{} }
	}
	var p leasePlan
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.re, p.err = s.cfg.Leases.PlanReissue(ctx, sb, actor)
		p.planned = p.err == nil
		if <-write && p.re != nil {
			p.wrote, p.fileErr = true, p.re.WriteFiles()
		}
	}()
	return func() leasePlan { <-done; return p }
}

// commitResume moves the sandbox to running (set fills in the resume's
// fields); with a planned reissue, its leases' change goes in the same
// commit (folded), its files written beside it unless they were already.
// If that commit fails (the leases changed since the plan, a placeholder
// taken), nothing of it was written: the state is committed alone and the
// resumed hook reissues as before (the files it wrote name no lease).
func (s *Service) commitResume(ctx context.Context, id, actor, why string, p leasePlan, set func(*sandbox.Sandbox)) (_ *sandbox.Sandbox, folded bool, fileErr, err error) {
	if p.planned && p.re == nil {
		// Nothing to reissue (no lease, no grant): nothing for the hook either.
		out, err := s.core.Transition(ctx, id, sandbox.Running, actor, "resumed", why, func(sb *sandbox.Sandbox) error {
			set(sb)
			return nil
		})
		return out, true, nil, err
	}
	if re := p.re; re != nil {
		files := make(chan error, 1)
		if p.wrote {
			files <- p.fileErr
		} else {
			go func() { files <- re.WriteFiles() }()
		}
		out, err := s.core.TransitionLeases(ctx, id, sandbox.Running, actor, "resumed", why, func(sb *sandbox.Sandbox) error {
			set(sb)
			re.SetRow(sb)
			return nil
		}, re.Rows())
		fileErr := <-files
		if err == nil {
			return out, true, fileErr, nil
		}
		s.log.WarnContext(ctx, "resume with its lease reissue not committed; committing the state alone", "sandbox_id", id, "err", err)
	}
	out, err := s.core.Transition(ctx, id, sandbox.Running, actor, "resumed", why, func(sb *sandbox.Sandbox) error {
		set(sb)
		return nil
	})
	return out, false, nil, err
}

// restore starts the sandbox from its memory image and tells the agent.
func (s *Service) restore(ctx context.Context, sb *sandbox.Sandbox, count int) (err error) {
	// Its own phases in the debug log: the resume's "memory" phase is all
	// of this, and the runtime's restore is only part of it.
	ph := phases.Start("restore")
	defer func() { ph.Log(ctx, s.log, sb.ID, err) }()
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return err
	}
	img := s.MemoryDir(sb.ID)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("no memory image: %w", err)
	}
	tpl, err := s.core.Store().GetTemplate(ctx, sb.Template)
	if err != nil {
		return err
	}
	lowers, err := s.snaps.LowersFor(sb, &tpl)
	if err != nil {
		return err
	}
	ph.Mark("lookup")
	// As in boot: attach the network while the filesystem is mounted.
	netErr := make(chan error, 1)
	go func() { netErr <- s.core.NetUp(ctx, sb, "") }()
	root, err := s.core.RemountRoot(ctx, s.core.SandboxDir(sb.ID), lowers, s.core.UserNS(sb))
	if nerr := <-netErr; err != nil || nerr != nil {
		return errors.Join(err, nerr)
	}
	s.core.NetTrust(sb, root)
	ph.Mark("net_and_root")
	ch, err := s.core.OpenChannel(sb.ID)
	if err != nil {
		return err
	}
	if err := s.boundedRestore(ctx, rt, sb, s.core.Spec(sb, &tpl, root), img); err != nil {
		return err
	}
	ph.Mark("runtime_restore")
	// The sandbox runs while its pages may still load (pageload.go): the
	// image moves aside, to be removed when the load is over.
	discard := img
	if err := os.Rename(img, s.loadingDir(sb.ID, count)); err == nil {
		discard = s.loadingDir(sb.ID, count)
	}
	s.watchPageLoad(sb, rt, count, discard)
	if err := rt.Kill(ctx, sb.ID, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("wake agent: %w", err)
	}
	ph.Mark("wake")
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	c := ch.Client()
	if _, err := c.WaitReady(wctx, 2*time.Millisecond); err != nil {
		return err
	}
	ph.Mark("agent_ready")
	err = c.Restored(ctx, agentapi.RestoredRequest{RestoreCount: count, HostTime: time.Now()})
	ph.Mark("agent_restored")
	return err
}

// canFreeze asks only what is known now: runc's capabilities otherwise
// wait for its trial checkpoint, which a freeze does not need.
func canFreeze(ctx context.Context, rt runtime.Runtime) bool {
	now, cancel := context.WithCancel(ctx)
	cancel()
	return rt.Capabilities(now).Freeze
}

// boundedRestore is rt.Restore within checkpointTimeout; on failure the
// half-restored container is removed (on a fresh context).
func (s *Service) boundedRestore(ctx context.Context, rt runtime.Runtime, sb *sandbox.Sandbox, spec runtime.Spec, img string) error {
	limit := s.checkpointTimeout(sb)
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := rt.Restore(rctx, spec, img)
	if err == nil {
		return nil
	}
	timedOut := rctx.Err() != nil
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer dcancel()
	_ = rt.Delete(dctx, sb.ID)
	if timedOut {
		return fmt.Errorf("restore did not finish within %s; the runtime's restore helper was killed: %w", limit, err)
	}
	return err
}

// ReconcilePaused settles sandboxes caught mid-pause or mid-resume by a
// daemon crash: never half — either running or paused with a complete image.
func (s *Service) ReconcilePaused(ctx context.Context, sb *sandbox.Sandbox, alive bool) error {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return err
	}
	// A partial image (the daemon died while writing it) is never used.
	_ = os.RemoveAll(s.MemoryDir(sb.ID) + ".tmp")
	_, imgErr := os.Stat(s.MemoryDir(sb.ID))
	hasImage := imgErr == nil
	toPausedDisk := func(reason string) error {
		if err := s.core.Halt(ctx, sb); err != nil {
			return err
		}
		actual := sandbox.PauseDisk
		if hasImage {
			actual = sandbox.PauseMemory
		}
		set := func(s *sandbox.Sandbox) error {
			s.PauseActual = actual
			return nil
		}
		const msg = "settled after a daemon restart"
		if sb.State == sandbox.Paused {
			// Already paused (a lost freeze): Paused → Paused is no move in
			// the state table, only what it is paused with changes.
			_, err := s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
				s.Reason, s.Message = reason, msg
				return set(s)
			})
			return err
		}
		_, err := s.core.Transition(ctx, sb.ID, sandbox.Paused, "berth", reason, msg, set)
		return err
	}
	switch sb.State {
	case sandbox.Pausing, sandbox.Resuming:
		if alive && !hasImage {
			_ = rt.Thaw(ctx, sb.ID)
			_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
			hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := s.core.AgentClient(sb.ID).WaitReady(hctx, 20*time.Millisecond)
			cancel()
			if err == nil {
				_, err := s.core.Transition(ctx, sb.ID, sandbox.Running, "berth", "pause_interrupted", "the daemon restarted during a pause or resume; the sandbox kept running", nil)
				return err
			}
		}
		return toPausedDisk("pause_interrupted")
	case sandbox.Paused:
		if sb.PauseActual == sandbox.PauseFreeze {
			if alive {
				return nil
			}
			// The frozen processes are gone (host reboot?): the disk is still the promise.
			s.core.Event(ctx, sb, "berth", "pause_degraded", "freeze_lost", "frozen processes were gone after a restart; the workspace is kept",
				map[string]string{"requested": string(sandbox.PauseFreeze), "actual": string(sandbox.PauseDisk)})
			return toPausedDisk("freeze_lost")
		}
		if alive {
			return s.core.Halt(ctx, sb)
		}
		return nil
	}
	return errors.New("unexpected state " + string(sb.State))
}

var errPaused = errs.E(errs.Unavailable, "sandbox paused")

// notifyPaused ends open streams of a sandbox that is being paused.
func (s *Service) notifyPaused(id string) {
	s.pauseMu.Lock()
	if ch, ok := s.pauseCh[id]; ok {
		close(ch)
		delete(s.pauseCh, id)
	}
	s.pauseMu.Unlock()
}

// PauseSignal returns a channel closed when the sandbox starts pausing.
// Stream handlers select on it to end with a clear "sandbox paused" error.
func (s *Service) PauseSignal(id string) <-chan struct{} {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	ch, ok := s.pauseCh[id]
	if !ok {
		ch = make(chan struct{})
		s.pauseCh[id] = ch
	}
	return ch
}

// ErrPaused is the error streams end with when their sandbox is paused.
func ErrPaused() error { return errPaused }
