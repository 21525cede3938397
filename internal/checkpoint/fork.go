package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/trace"
)

// Fork modes: what the children got from their parent.
const (
	ForkMemory = "memory" // files and running processes (one memory image, restored N times)
	ForkDisk   = "disk"   // files only; the children boot fresh
)

// MaxFork is the most children one fork request may ask for.
const MaxFork = 100

// forkConcurrency bounds how many children start at once.
const forkConcurrency = 4

// ForkResult is what a fork made.
type ForkResult struct {
	Parent    string             `json:"parent"`
	Snapshot  string             `json:"snapshot"`
	Mode      string             `json:"fork_mode"`
	Reason    string             `json:"reason,omitempty"` // why disk when memory was wanted
	Sandboxes []*sandbox.Sandbox `json:"sandboxes"`
	Millis    int64              `json:"ms"`
}

// Fork makes count independent sandboxes from a running sandbox's current
// state: always its files (a snapshot layer under fresh workspaces), and its
// memory too when the runtime can checkpoint — one checkpoint, the parent
// restored from it, then one restore per child. It says which it did.
func (s *Service) Fork(ctx context.Context, owner, id, actor string, count int) (_ ForkResult, err error) {
	ctx, span := trace.Phase(ctx, "sandbox.fork", trace.Int("fork.count", count))
	defer span.EndErr(&err)
	if count < 1 || count > MaxFork {
		return ForkResult{}, errs.Field("count", "must be between 1 and %d, got %d", MaxFork, count)
	}
	start := time.Now()
	unlock := s.core.Lock(id)
	parent, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		unlock()
		return ForkResult{}, err
	}
	span.Set(trace.Sandbox(parent)...)
	if parent.State != sandbox.Running {
		unlock()
		return ForkResult{}, errs.E(errs.Conflict, "sandbox %s is %s; only a running sandbox can be forked", id, parent.State)
	}
	// The fork's snapshot is stored like any other, and its children run
	// like creates: both are admitted (quota.go). Children are admitted one
	// by one; asking first refuses a fork none of whose children could run
	// before it takes a snapshot.
	if err := s.core.CheckAdmit(ctx, parent.Owner, parent.Resources); err != nil {
		unlock()
		return ForkResult{}, err
	}
	releaseSnap, err := s.core.ReserveSnapshot(ctx, parent.Owner)
	if err != nil {
		unlock()
		return ForkResult{}, err
	}
	sn, mode, reason, err := s.forkCapture(ctx, parent, actor)
	releaseSnap()
	unlock()
	if err != nil {
		return ForkResult{}, err
	}
	span.Set(trace.String("fork.mode", mode), trace.String("fork.reason", reason), trace.String("fork.snapshot", sn.ID))
	gen := nextGeneration(parent.Lineage.Generation)
	res := ForkResult{Parent: parent.ID, Snapshot: sn.ID, Mode: mode, Reason: reason, Sandboxes: make([]*sandbox.Sandbox, count)}
	errList := make([]error, count)
	sem := make(chan struct{}, forkConcurrency)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res.Sandboxes[i], errList[i] = s.forkChild(ctx, parent, sn, mode, actor, gen)
		}()
	}
	wg.Wait()
	var made []*sandbox.Sandbox
	for _, sb := range res.Sandboxes {
		if sb != nil {
			made = append(made, sb)
		}
	}
	res.Sandboxes = made
	res.Millis = time.Since(start).Milliseconds()
	s.core.Event(ctx, parent, actor, "fork", "forked", reason, map[string]string{
		"snapshot": sn.ID, "fork_mode": mode, "children": strconv.Itoa(len(made)), "ms": formatInt(res.Millis)})
	s.log.InfoContext(ctx, "sandbox forked", "sandbox_id", parent.ID, "children", len(made), "fork_mode", mode, "ms", res.Millis)
	if err := errors.Join(errList...); err != nil {
		if len(made) == 0 {
			return ForkResult{}, err
		}
		failed := fmt.Sprintf("%d of %d children failed: %s", count-len(made), count, errs.Short(err))
		if res.Reason != "" {
			failed = res.Reason + "; " + failed
		}
		res.Reason = failed
	}
	return res, nil
}

// forkCapture takes the fork's snapshot with the parent locked: files
// always, a memory image when the runtime can checkpoint. The parent is
// running again when it returns.
func (s *Service) forkCapture(ctx context.Context, parent *sandbox.Sandbox, actor string) (_ store.Snapshot, _, _ string, err error) {
	ctx, span := trace.Phase(ctx, "fork.capture")
	defer span.EndErr(&err)
	tctx, cancel := teardownCtx(ctx)
	defer func() { cancel() }() // cancel is replaced after a failed checkpoint
	rt, err := s.core.RuntimeFor(parent)
	if err != nil {
		return store.Snapshot{}, "", "", err
	}
	base, err := s.snaps.layerDigests(tctx, parent)
	if err != nil {
		return store.Snapshot{}, "", "", err
	}
	if err := os.MkdirAll(filepath.Join(s.cfg.DataDir, "snapshots"), 0o700); err != nil {
		return store.Snapshot{}, "", "", errs.Wrap(errs.Internal, err, "create snapshots dir")
	}
	start := time.Now()
	plan := planFork(parent.Runtime, rt.Capabilities(tctx), isExporter(rt))
	if !plan.memory {
		layer, err := s.snaps.CaptureUpper(tctx, parent, true)
		if err != nil {
			return store.Snapshot{}, "", "", err
		}
		sn, err := s.snaps.recordSnapshot(tctx, "", parent, "", actor, layer, base, "", time.Since(start))
		return sn, ForkDisk, plan.reason, err
	}
	snapID := sandbox.NewID()
	img := filepath.Join(s.snaps.dir(snapID), "memory")
	var layer template.Layer
	exports := plan.exportFirst
	if exports {
		// runsc keeps rootfs writes inside the sandbox: export them while it runs.
		if layer, err = s.snaps.CaptureUpper(tctx, parent, true); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	mode, reason := ForkMemory, ""
	limit := s.checkpointTimeout(parent)
	cctx, ccancel := context.WithTimeout(tctx, limit)
	err = trace.Do(cctx, "fork.checkpoint", func(ctx context.Context) error { return s.checkpointTo(ctx, parent, img) })
	timedOut := err != nil && cctx.Err() != nil
	ccancel()
	if err != nil {
		mode, reason = ForkDisk, "memory checkpoint failed: "+errs.Short(err)
		if timedOut {
			reason = fmt.Sprintf("memory checkpoint did not finish within %s; the runtime's checkpoint helper was killed", limit)
		}
		s.log.WarnContext(ctx, "fork checkpoint failed", "sandbox_id", parent.ID, "err", err)
		_ = os.RemoveAll(s.snaps.dir(snapID))
		// The rest of the fork runs on a fresh context: the checkpoint may
		// have used up this one.
		cancel()
		tctx, cancel = teardownCtx(ctx)
		s.thawAfterCheckpoint(tctx, parent)
		if err := s.ensureRunning(tctx, parent, timedOut); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	if !exports {
		// runc: the container is stopped (memory) or running (disk); copy the host upper.
		if layer, err = s.snaps.CaptureUpper(tctx, parent, mode == ForkDisk); err != nil {
			if mode == ForkMemory {
				err = errors.Join(err, s.restoreParent(tctx, parent, img))
			}
			return store.Snapshot{}, "", "", err
		}
	}
	if mode == ForkMemory {
		if err := trace.Do(tctx, "fork.restore_parent", func(ctx context.Context) error { return s.restoreParent(ctx, parent, img) }); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	memPath := ""
	if mode == ForkMemory {
		memPath = img
	}
	sn, err := s.snaps.recordSnapshot(tctx, snapID, parent, "", actor, layer, base, memPath, time.Since(start))
	return sn, mode, reason, err
}

// checkpointTo quiesces the agent and writes a memory image of sb to img.
// The container stops; its filesystem stays mounted.
func (s *Service) checkpointTo(ctx context.Context, sb *sandbox.Sandbox, img string) error {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return err
	}
	if err := s.quiesceAgent(ctx, sb.ID); err != nil {
		_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
		return fmt.Errorf("quiesce agent: %w", err)
	}
	if err := rt.Checkpoint(ctx, sb.ID, img); err != nil {
		// The caller thaws the container and lets the agent listen again.
		_ = os.RemoveAll(img)
		return err
	}
	// The parent is restored under its own id next: remove what is left.
	return rt.Delete(ctx, sb.ID)
}

// ensureRunning brings a parent back whose checkpoint failed half-way. A
// checkpoint killed mid-way (killed) may have left CRIU's traces in the
// processes (network lock, parasite), so that parent is booted again.
func (s *Service) ensureRunning(ctx context.Context, sb *sandbox.Sandbox, killed bool) error {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return err
	}
	if st, err := rt.State(ctx, sb.ID); err == nil && st.State == "running" && !killed {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := s.core.AgentClient(sb.ID).WaitReady(wctx, 10*time.Millisecond); err == nil {
			return nil
		}
	}
	s.core.Event(ctx, sb, "berth", "fork", "parent_rebooted", "the failed checkpoint stopped or disturbed the parent; it was booted again from its workspace", nil)
	_ = s.core.Halt(ctx, sb)
	if err := s.core.Boot(ctx, sb); err != nil {
		s.core.Fail(ctx, sb, "fork_failed", err)
		return err
	}
	return nil
}

// restoreParent starts the parent again from the fork's memory image; if
// that fails it boots from its workspace, and says so.
func (s *Service) restoreParent(ctx context.Context, sb *sandbox.Sandbox, img string) error {
	count := sb.RestoreCount + 1
	if sb.Runtime == "runsc" {
		// runsc moved the attachment's addresses into its own netstack when
		// it started, so a restore into that namespace finds none and the
		// parent comes back without a network: attach a fresh one, as a
		// memory resume does.
		if err := s.core.NetDown(ctx, sb); err != nil {
			s.log.Warn("fork: detach the parent's network before its restore", "sandbox_id", sb.ID, "err", err)
		}
	}
	lowers, err := s.snaps.lowersForSandbox(ctx, sb)
	if err == nil {
		err = s.restoreFrom(ctx, sb, lowers, img, count, "", 0)
	}
	if err == nil {
		_, err = s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
			s.RestoreCount = count
			return nil
		})
		return err
	}
	s.log.Warn("fork: parent restore failed; booting it from its workspace", "sandbox_id", sb.ID, "err", err)
	s.core.Event(ctx, sb, "berth", "fork", "parent_rebooted", "restoring the parent from the fork image failed: "+errs.Short(err), nil)
	rt, _ := s.core.RuntimeFor(sb)
	if rt != nil {
		_ = rt.Delete(ctx, sb.ID)
	}
	if err := s.core.Boot(ctx, sb); err != nil {
		s.core.Fail(ctx, sb, "fork_failed", err)
		return err
	}
	return nil
}

// restoreFrom starts sb (whose filesystem is prepared, or is prepared here
// over lowers) from memory image img and wakes its agent. imageOf is the
// sandbox whose agent the image holds when it is not sb (a fork's parent):
// that agent authenticates with the parent's key once, and is rekeyed to
// sb's own id and key over the authenticated channel before sb is handed out.
func (s *Service) restoreFrom(ctx context.Context, sb *sandbox.Sandbox, lowers []string, img string, count int, imageOf string, diskMiB int64) error {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return err
	}
	dir := s.core.SandboxDir(sb.ID)
	var root string
	if diskMiB > 0 {
		if err := s.core.PickUserNS(ctx, sb); err != nil {
			return err
		}
		if err := s.core.ShareSandboxDir(sb); err != nil {
			return err
		}
		root, err = s.core.PrepareRoot(ctx, dir, lowers, diskMiB, s.core.UserNS(sb))
	} else {
		root, err = s.core.RemountRoot(ctx, dir, lowers, s.core.UserNS(sb))
	}
	if err != nil {
		return err
	}
	if err := s.core.NetUp(ctx, sb, root); err != nil {
		return err
	}
	ch, err := s.core.OpenChannel(sb.ID)
	if err != nil {
		return err
	}
	req := agentapi.RestoredRequest{RestoreCount: count}
	if imageOf != "" && imageOf != sb.ID {
		forget := ch.Allow(imageOf, s.core.AgentKey(imageOf))
		defer forget()
		req.SandboxID, req.Key = sb.ID, hex.EncodeToString(s.core.AgentKey(sb.ID))
	}
	if err := s.boundedRestore(ctx, rt, sb, s.core.Spec(sb, nil, root), img); err != nil {
		return err
	}
	// img is a snapshot's or a timeline checkpoint's and outlives the
	// load: a snapshot is not deleted while a sandbox made from it exists.
	s.watchPageLoad(sb, rt, count, "")
	if err := rt.Kill(ctx, sb.ID, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("wake agent: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	c := ch.Client()
	if _, err := c.WaitReady(wctx, 5*time.Millisecond); err != nil {
		return err
	}
	req.HostTime = time.Now()
	return c.Restored(ctx, req)
}

// forkChild makes one child of parent from snapshot sn.
func (s *Service) forkChild(ctx context.Context, parent *sandbox.Sandbox, sn store.Snapshot, mode, actor string, gen int) (child *sandbox.Sandbox, err error) {
	ctx, span := trace.Phase(ctx, "fork.child", trace.String("fork.mode", mode))
	defer func() { span.Set(trace.Sandbox(child)...); span.EndErr(&err) }()
	lineage := sandbox.Attrs{
		Lineage: sandbox.Lineage{Parent: parent.ID, Generation: gen, ForkMode: mode},
		Net:     s.core.NetworkInherit(parent), // children keep the parent's policy and grants
	}
	if pc := parent.Cluster; pc.Node != "" {
		// A cluster sandbox's children are the cluster's, bound to its node;
		// their objects come from the replica only after the answer.
		now := s.core.Now().UTC()
		lineage.Cluster = sandbox.ClusterState{Node: pc.Node, ExpectedDuration: pc.ExpectedDuration,
			DurationClass: pc.DurationClass, BoundAt: now, AdoptFrom: now}
	}
	if mode == ForkDisk {
		ttl := parent.ExpiresAt.Sub(s.core.Now())
		if ttl < time.Minute {
			ttl = time.Minute
		}
		sb, err := s.core.CreateChild(ctx, ChildRequest{
			Owner: parent.Owner, Actor: actor, Runtime: parent.Runtime, TTL: ttl, ExpiryAction: parent.ExpiryAction,
			Resources: parent.Resources, Labels: maps.Clone(parent.Labels), Env: maps.Clone(parent.Env),
			AutoResume: parent.AutoResume, FromSnapshot: sn.ID, Attrs: lineage,
		})
		if err != nil {
			return nil, err
		}
		s.personalizeChild(ctx, sb, parent, sn, mode, actor, "")
		return sb, nil
	}
	return s.forkRestore(ctx, parent, sn, lineage, actor)
}

// forkRestore makes a child from the snapshot's memory image; a child whose
// restore fails boots from the snapshot's files instead (fork_mode disk).
func (s *Service) forkRestore(ctx context.Context, parent *sandbox.Sandbox, sn store.Snapshot, attrs sandbox.Attrs, actor string) (*sandbox.Sandbox, error) {
	now := s.core.Now()
	attrs.Layers = slices.Clone(sn.Layers)
	attrs.Lineage.Snapshot = sn.ID
	// The memory image was dumped in the parent's user namespace (or none):
	// the child's workspace must be made for the same.
	attrs.UserNS = sandbox.UserNSNone
	if m := s.core.UserNS(parent); m != nil {
		attrs.UserNS = m.String()
	}
	sb := &sandbox.Sandbox{
		ID: sandbox.NewID(), Owner: parent.Owner, Template: parent.Template, TemplateID: parent.TemplateID,
		Runtime: parent.Runtime, State: sandbox.Creating, Labels: maps.Clone(parent.Labels), Env: maps.Clone(parent.Env),
		Resources: parent.Resources, CreatedAt: now, ExpiresAt: parent.ExpiresAt, ExpiryAction: parent.ExpiryAction,
		AutoResume: parent.AutoResume, Attrs: attrs,
	}
	sb.AccessTokenHash = s.core.AccessTokenHash(sb.ID, sb.Owner)
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	if !sb.ExpiresAt.After(now.Add(time.Minute)) {
		sb.ExpiresAt = now.Add(time.Minute)
	}
	if err := s.core.Admit(ctx, sb); err != nil { // quota, then the creating intent
		return nil, err
	}
	s.core.Event(ctx, sb, actor, "transition", "created", "forked from "+parent.ID, map[string]string{"template": sb.Template, "runtime": sb.Runtime})
	unlock := s.core.Lock(sb.ID)
	defer unlock()
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if err := s.core.EnsureChanDir(sb.ID); err != nil {
		s.core.Fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	lowers, err := s.snaps.LowersFor(sb, nil)
	if err == nil {
		err = s.core.WriteEnv(sb)
	}
	if err != nil {
		s.core.Fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	why := ""
	if err := trace.Do(tctx, "fork.restore", func(ctx context.Context) error {
		return s.restoreFrom(ctx, sb, lowers, sn.MemoryPath, 1, parent.ID, sb.Resources.DiskMiB)
	}); err != nil {
		why = "memory restore failed: " + errs.Short(err)
		s.log.WarnContext(ctx, "fork: child restore failed; booting from the snapshot's files", "sandbox_id", sb.ID, "err", err)
		_ = s.core.Halt(tctx, sb)
		if err := s.core.Boot(tctx, sb); err != nil {
			s.core.Fail(tctx, sb, "create_failed", err)
			return nil, err
		}
	}
	started := s.core.Now()
	out, err := s.core.Transition(tctx, sb.ID, sandbox.Running, actor, "forked", why, func(s *sandbox.Sandbox) error {
		s.StartedAt = started
		if why != "" {
			s.Lineage.ForkMode = ForkDisk
		} else {
			s.RestoreCount = 1
		}
		return nil
	})
	if err != nil {
		s.core.Fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	s.personalizeChild(tctx, out, parent, sn, out.Lineage.ForkMode, actor, why)
	return out, nil
}

// personalizeChild gives a fork its own /etc/machine-id and records the fork.
func (s *Service) personalizeChild(ctx context.Context, sb, parent *sandbox.Sandbox, sn store.Snapshot, mode, actor, why string) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.core.AgentClient(sb.ID).WriteFile(wctx, "/etc/machine-id", "root", 0o444, strings.NewReader(hex.EncodeToString(b[:])+"\n")); err != nil {
		s.log.Warn("fork: write machine-id", "sandbox_id", sb.ID, "err", err)
	}
	s.core.Event(ctx, sb, actor, "fork", "forked", why, map[string]string{
		"parent": parent.ID, "snapshot": sn.ID, "fork_mode": mode, "generation": strconv.Itoa(sb.Lineage.Generation)})
	_ = s.cfg.Hooks.Fire(ctx, statehook.Event{Phase: statehook.Forked, Sandbox: sb, Actor: actor,
		From: parent.ID, Snapshot: sn.ID, PointAt: sn.CreatedAt})
}
