package timeline

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// RewindResult is what a rewind did.
type RewindResult struct {
	Sandbox    *sandbox.Sandbox
	Checkpoint store.Checkpoint
	Mode       string // ModeMemory: the processes are the checkpoint's; ModeFiles: booted on its files
	Reason     string // why files when the checkpoint has a memory image
	Millis     int64
}

// Rewind takes a running sandbox back to checkpoint ref of its timeline,
// in place: same id, token, owner, expiry and network policy. Its
// processes stop, it restarts on the checkpoint's layers with an empty
// upper (as a disk resume boots), from the checkpoint's memory image when
// it has one and the restore works. Later checkpoints stay on the
// timeline; the next checkpoint is a delta against this one.
func (s *Service) Rewind(ctx context.Context, owner, id, ref, actor string) (RewindResult, error) {
	start := time.Now()
	unlock := s.core.Lock(id)
	defer unlock()
	locked := time.Now()
	sb, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return RewindResult{}, err
	}
	if sb.State != sandbox.Running {
		return RewindResult{}, errs.E(errs.Conflict, "sandbox %s is %s; only a running sandbox can be rewound", sb.ID, sb.State)
	}
	list, err := s.core.Store().ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return RewindResult{}, err
	}
	c, err := resolve(list, ref, "to")
	if err != nil {
		return RewindResult{}, err
	}
	lowers, err := s.lowerPaths(c.Layers)
	if err != nil {
		return RewindResult{}, err
	}
	_, imgErr := os.Stat(c.MemoryPath)
	memory, reason := rewindMode(c, sb.Runtime, c.MemoryPath != "" && imgErr == nil)
	img := ""
	if memory {
		img = c.MemoryPath
	}
	resolved := time.Now()
	mode, why, err := s.restartOn(ctx, sb, c.Layers, lowers, img, "")
	if err != nil {
		return RewindResult{}, err
	}
	if why != "" {
		reason = why
	}
	restarted := time.Now()
	if err := s.core.Store().SetTimelineHead(ctx, store.TimelineHead{Sandbox: sb.ID, Checkpoint: c.ID, Layers: c.Layers}); err != nil {
		return RewindResult{}, err
	}
	headed := time.Now()
	res := RewindResult{Sandbox: sb, Checkpoint: c, Mode: mode, Reason: reason, Millis: time.Since(start).Milliseconds()}
	s.core.Event(ctx, sb, actor, "rewind", "rewound", reason, map[string]string{
		"to": c.ID, "seq": strconv.FormatInt(c.Seq, 10), "mode": mode, "ms": strconv.FormatInt(res.Millis, 10)})
	s.log.Info("sandbox rewound", "sandbox_id", sb.ID, "checkpoint", c.ID, "mode", mode, "ms", res.Millis)
	if out, err := s.core.Store().GetSandbox(ctx, sb.ID); err == nil {
		res.Sandbox = out
	}
	_ = s.cfg.Hooks.Fire(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: res.Sandbox, Actor: actor,
		From: sb.ID, Checkpoint: c.ID, PointAt: c.CreatedAt})
	s.log.Debug("rewind phases", "sandbox_id", sb.ID, "lock_ms", msOf(locked.Sub(start)), "resolve_ms", msOf(resolved.Sub(locked)),
		"restart_ms", msOf(restarted.Sub(resolved)), "head_ms", msOf(headed.Sub(restarted)), "event_hooks_ms", msOf(time.Since(headed)))
	return res, nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// restartOn restarts sb (locked, running) on layers (digests, top first;
// lowers their paths) with a fresh, empty workspace: from memory image img
// when not "" (the image of sandbox imageOf when that is not sb), else a
// boot. The old workspace is kept aside until the new start succeeded: a
// failed restart boots sb again on its old layers and workspace, so a
// failed rewind or promote never costs the sandbox its disk. mode says
// what it started from, why why not from memory.
func (s *Service) restartOn(ctx context.Context, sb *sandbox.Sandbox, layers, lowers []string, img, imageOf string) (mode, why string, err error) {
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	l := rootfs.LayoutOf(s.core.SandboxDir(sb.ID))
	aside := l.Image + ".timeline"
	oldLayers := slices.Clone(sb.Layers)
	t0 := time.Now()
	s.killFirst(tctx, sb)
	t1 := time.Now()
	if err := s.haltForRestart(tctx, sb, img != ""); err != nil {
		// Still running as it was: let it be.
		if berr := s.core.Boot(tctx, sb); berr != nil {
			s.core.Fail(tctx, sb, "restart_failed", errors.Join(err, berr))
		}
		return "", "", errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "stop sandbox %s", sb.ID)
	}
	halted := time.Now()
	_ = os.Remove(aside)
	if err := writeJournal(l.Dir, restartJournal{Old: oldLayers, New: layers}); err != nil {
		return "", "", errors.Join(errs.Wrap(errs.Internal, err, "restart journal of %s", sb.ID), s.rebootOld(tctx, sb))
	}
	defer os.Remove(journalPath(l.Dir))
	if err := os.Rename(l.Image, aside); err != nil {
		return "", "", errors.Join(errs.Wrap(errs.Internal, err, "set the workspace of %s aside", sb.ID), s.rebootOld(tctx, sb))
	}
	if err := s.setLayers(tctx, sb, layers); err != nil {
		return "", "", errors.Join(err, s.rollback(tctx, sb, aside, oldLayers))
	}
	mode = ModeFiles
	if img != "" {
		if err := s.core.RestoreInto(tctx, sb, lowers, img, imageOf, sb.Resources.DiskMiB); err != nil {
			why = "memory restore failed: " + errs.Short(err)
			s.log.Warn("timeline: restore failed; booting on the files", "sandbox_id", sb.ID, "err", err)
			_ = s.core.Halt(tctx, sb)
			_ = os.Remove(l.Image)
		} else {
			mode = ModeMemory
		}
	}
	t2 := time.Now()
	if mode == ModeFiles {
		if err := s.core.Boot(tctx, sb); err != nil {
			return "", "", errors.Join(errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "restart %s", sb.ID),
				s.rollback(tctx, sb, aside, oldLayers))
		}
	}
	t3 := time.Now()
	_ = os.Remove(aside)
	s.log.Debug("timeline: restarted", "sandbox_id", sb.ID, "mode", mode, "kill_ms", t1.Sub(t0).Milliseconds(),
		"halt_ms", halted.Sub(t1).Milliseconds(), "switch_ms", t2.Sub(halted).Milliseconds(),
		"boot_ms", t3.Sub(t2).Milliseconds(), "drop_ms", time.Since(t3).Milliseconds())
	return mode, why, nil
}

// haltForRestart stops sb for the start that follows, keeping its network
// attachment for it (Core.HaltForRestart) — except for a runsc memory
// restore: the restored Sentry's netstack is the image's, and a restore
// into a kept namespace is not what a memory resume and a fork's parent
// (internal/checkpoint restoreParent) do; those detach and attach afresh.
func (s *Service) haltForRestart(ctx context.Context, sb *sandbox.Sandbox, restore bool) error {
	if restore && sb.Runtime == "runsc" {
		return s.core.Halt(ctx, sb)
	}
	return s.core.HaltForRestart(ctx, sb)
}

// rollback puts sb's old workspace and layers back and boots it again.
func (s *Service) rollback(ctx context.Context, sb *sandbox.Sandbox, aside string, oldLayers []string) error {
	_ = s.core.Halt(ctx, sb)
	l := rootfs.LayoutOf(s.core.SandboxDir(sb.ID))
	_ = os.Remove(l.Image)
	var errList []error
	if err := os.Rename(aside, l.Image); err != nil {
		errList = append(errList, err)
	}
	if err := s.setLayers(ctx, sb, oldLayers); err != nil {
		errList = append(errList, err)
	}
	if err := s.rebootOld(ctx, sb); err != nil {
		errList = append(errList, err)
	}
	return errors.Join(errList...)
}

func (s *Service) rebootOld(ctx context.Context, sb *sandbox.Sandbox) error {
	if err := s.core.Boot(ctx, sb); err != nil {
		s.core.Fail(ctx, sb, "restart_failed", err)
		return err
	}
	return nil
}

func (s *Service) setLayers(ctx context.Context, sb *sandbox.Sandbox, layers []string) error {
	out, err := s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		s.Layers = slices.Clone(layers)
		return nil
	})
	if err != nil {
		return err
	}
	sb.Attrs = out.Attrs
	return nil
}

// PromoteRequest asks a parent to take one fork child's state.
type PromoteRequest struct {
	Owner, Actor  string
	Child         string
	DiscardOthers bool // delete the parent's other children after the promote
}

// PromoteResult is what a promote did.
type PromoteResult struct {
	Parent    *sandbox.Sandbox
	From      string
	Layer     string
	Mode      string // ModeMemory: the parent runs the child's processes; ModeFiles: booted on its files
	Reason    string
	Discarded []string
	Millis    int64
}

// Promote makes a fork child's state its parent's (docs/FORK-MERGE.md
// §3): the child's upper captured as a layer L (with a memory image of the
// child where the runtime can take one; the child keeps running), then the
// parent restarted on [L, the child's layers...] with an empty upper, from
// that image when there is one. The parent keeps its id, token, owner,
// expiry and network policy.
func (s *Service) Promote(ctx context.Context, req PromoteRequest) (PromoteResult, error) {
	start := time.Now()
	child, err := s.core.Visible(ctx, req.Owner, req.Child)
	if err != nil {
		return PromoteResult{}, err
	}
	parentID := child.Lineage.Parent
	if parentID == "" {
		return PromoteResult{}, errs.E(errs.FailedPrecondition, "sandbox %s is not a fork child: there is no parent to promote it into", child.ID)
	}
	if _, err := s.core.Visible(ctx, req.Owner, parentID); err != nil {
		return PromoteResult{}, errs.Reclassify(errs.FailedPrecondition, err, "parent %s of %s", parentID, child.ID)
	}
	// 1. The child's state, with the child's lock only.
	layer, childLayers, img, memReason, err := s.captureChild(ctx, req.Owner, child.ID)
	if img != "" {
		defer os.RemoveAll(filepath.Dir(img))
	}
	if err != nil {
		return PromoteResult{}, err
	}
	// 2. The parent restarted on it, with the parent's lock only.
	unlock := s.core.Lock(parentID)
	parent, err := s.core.Visible(ctx, req.Owner, parentID)
	if err == nil && parent.State != sandbox.Running {
		err = errs.E(errs.Conflict, "parent %s is %s; only a running sandbox can take a child's state", parentID, parent.State)
	}
	if err == nil && img != "" && parent.Runtime != child.Runtime {
		img, memReason = "", "the child runs on "+child.Runtime+", the parent on "+parent.Runtime
	}
	if err != nil {
		unlock()
		return PromoteResult{}, err
	}
	machineID := s.readMachineID(ctx, parent.ID)
	layers := promoteLayers(layer.Digest, childLayers)
	lowers, err := s.lowerPaths(layers)
	if err != nil {
		unlock()
		return PromoteResult{}, err
	}
	mode, why, err := s.restartOn(ctx, parent, layers, lowers, img, child.ID)
	if err == nil {
		// The next checkpoint is a delta against the layers it now boots on.
		if derr := s.core.Store().DeleteTimelineHead(ctx, parent.ID); derr != nil && !errs.Is(derr, errs.NotFound) {
			err = derr
		}
	}
	if err != nil {
		unlock()
		return PromoteResult{}, err
	}
	if why != "" {
		memReason = why
	}
	s.writeMachineID(ctx, parent.ID, machineID) // the parent keeps its own, as its hostname
	res := PromoteResult{Parent: parent, From: child.ID, Layer: layer.Digest, Mode: mode, Reason: memReason}
	s.core.Event(ctx, parent, req.Actor, "promote", "promoted", memReason, map[string]string{
		"from": child.ID, "layer": layer.Digest, "mode": mode})
	if out, err := s.core.Store().GetSandbox(ctx, parent.ID); err == nil {
		res.Parent = out
	}
	unlock()
	if req.DiscardOthers {
		all, _, err := s.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: parent.Owner})
		if err != nil {
			return res, err
		}
		refs := make([]childRef, 0, len(all))
		for _, sb := range all {
			refs = append(refs, childRef{id: sb.ID, parent: sb.Lineage.Parent, deleted: sb.State == sandbox.Deleted})
		}
		var errList []error
		for _, id := range otherChildren(parent.ID, child.ID, refs) {
			if err := s.core.Delete(ctx, req.Owner, id, req.Actor); err != nil && !errs.Is(err, errs.NotFound) {
				errList = append(errList, err)
				continue
			}
			res.Discarded = append(res.Discarded, id)
		}
		if err := errors.Join(errList...); err != nil {
			return res, err
		}
	}
	res.Millis = time.Since(start).Milliseconds()
	s.log.Info("child promoted", "sandbox_id", parent.ID, "from", child.ID, "mode", mode, "ms", res.Millis)
	return res, nil
}

// captureChild captures a running child's upper as a layer and, where the
// runtime can, a memory image of it (the child keeps running). It returns
// the layer, the layers the child runs on, the image ("" = none) and why
// there is none.
func (s *Service) captureChild(ctx context.Context, owner, id string) (template.Layer, []string, string, string, error) {
	unlock := s.core.Lock(id)
	defer unlock()
	child, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return template.Layer{}, nil, "", "", err
	}
	if child.State != sandbox.Running {
		return template.Layer{}, nil, "", "", errs.E(errs.Conflict, "sandbox %s is %s; only a running child can be promoted", id, child.State)
	}
	childLayers, err := s.core.BootLayers(ctx, child)
	if err != nil {
		return template.Layer{}, nil, "", "", err
	}
	img := filepath.Join(s.cfg.DataDir, "checkpoints", "promote-"+sandbox.NewID(), "memory")
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return template.Layer{}, nil, "", "", errs.Wrap(errs.Internal, err, "create promote dir")
	}
	var layer template.Layer
	mem, why, err := s.core.CheckpointRunning(ctx, child, img, func(ctx context.Context, running bool) error {
		var err error
		layer, err = s.core.CaptureUpper(ctx, child, running)
		return err
	})
	if err == nil && layer.Digest == "" {
		err = errs.E(errs.Internal, "promote of %s captured no files", id)
	}
	if !mem {
		_ = os.RemoveAll(filepath.Dir(img))
		return layer, childLayers, "", why, err
	}
	return layer, childLayers, img, why, err
}

// maxMachineID bounds what is read of a sandbox's /etc/machine-id (32 hex
// digits and a newline; the file is the sandbox's, so anything else is
// not taken).
const maxMachineID = 64

// readMachineID reads a running sandbox's /etc/machine-id through its
// agent, bounded; "" when it has none or it is not one.
func (s *Service) readMachineID(ctx context.Context, id string) string {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rc, _, err := s.core.AgentClient(id).ReadFile(rctx, "/etc/machine-id", "root")
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxMachineID+1))
	if err != nil || len(b) > maxMachineID {
		return ""
	}
	v := strings.TrimSpace(string(b))
	if len(v) != 32 || strings.Trim(v, "0123456789abcdef") != "" {
		return ""
	}
	return v
}

// writeMachineID puts a sandbox's own machine-id back after a promote
// brought in its child's files.
func (s *Service) writeMachineID(ctx context.Context, id, v string) {
	if v == "" {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.core.AgentClient(id).WriteFile(wctx, "/etc/machine-id", "root", 0o444, strings.NewReader(v+"\n")); err != nil {
		s.log.Warn("promote: write machine-id", "sandbox_id", id, "err", err)
	}
}
