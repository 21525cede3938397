package daemon

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
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
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
func (d *Daemon) Fork(ctx context.Context, owner, id, actor string, count int) (ForkResult, error) {
	if count < 1 || count > MaxFork {
		return ForkResult{}, errs.Field("count", "must be between 1 and %d, got %d", MaxFork, count)
	}
	start := time.Now()
	unlock := d.Lock(id)
	parent, err := d.Visible(ctx, owner, id)
	if err != nil {
		unlock()
		return ForkResult{}, err
	}
	if parent.State != sandbox.Running {
		unlock()
		return ForkResult{}, errs.E(errs.Conflict, "sandbox %s is %s; only a running sandbox can be forked", id, parent.State)
	}
	// The fork's snapshot is stored like any other, and its children run
	// like creates: both are admitted (quota.go). Children are admitted one
	// by one; asking first refuses a fork none of whose children could run
	// before it takes a snapshot.
	if err := d.checkAdmit(ctx, parent.Owner, parent.Resources); err != nil {
		unlock()
		return ForkResult{}, err
	}
	releaseSnap, err := d.reserveSnapshot(ctx, parent.Owner)
	if err != nil {
		unlock()
		return ForkResult{}, err
	}
	sn, mode, reason, err := d.forkCapture(ctx, parent, actor)
	releaseSnap()
	unlock()
	if err != nil {
		return ForkResult{}, err
	}
	gen := 1
	if g := parent.Lineage.Generation; g > 0 {
		gen = g + 1
	}
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
			res.Sandboxes[i], errList[i] = d.forkChild(ctx, parent, sn, mode, actor, gen)
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
	d.Event(ctx, parent, actor, "fork", "forked", reason, map[string]string{
		"snapshot": sn.ID, "fork_mode": mode, "children": strconv.Itoa(len(made)), "ms": formatInt(res.Millis)})
	d.log.Info("sandbox forked", "sandbox_id", parent.ID, "children", len(made), "fork_mode", mode, "ms", res.Millis)
	if err := errors.Join(errList...); err != nil {
		if len(made) == 0 {
			return ForkResult{}, err
		}
		failed := fmt.Sprintf("%d of %d children failed: %s", count-len(made), count, shortError(err))
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
func (d *Daemon) forkCapture(ctx context.Context, parent *sandbox.Sandbox, actor string) (store.Snapshot, string, string, error) {
	tctx, cancel := teardownCtx(ctx)
	defer func() { cancel() }() // cancel is replaced after a failed checkpoint
	rt, err := d.RuntimeFor(parent)
	if err != nil {
		return store.Snapshot{}, "", "", err
	}
	base, err := d.layerDigests(tctx, parent)
	if err != nil {
		return store.Snapshot{}, "", "", err
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.DataDir, "snapshots"), 0o700); err != nil {
		return store.Snapshot{}, "", "", errs.Wrap(errs.Internal, err, "create snapshots dir")
	}
	start := time.Now()
	caps := rt.Capabilities(tctx)
	if !caps.Checkpoint {
		layer, err := d.captureUpper(tctx, parent, true)
		if err != nil {
			return store.Snapshot{}, "", "", err
		}
		sn, err := d.recordSnapshot(tctx, "", parent, "", actor, layer, base, "", time.Since(start))
		return sn, ForkDisk, "runtime " + parent.Runtime + " cannot checkpoint memory here: " + caps.CheckpointReason, err
	}
	snapID := sandbox.NewID()
	img := filepath.Join(d.snapshotDir(snapID), "memory")
	var layer template.Layer
	exports := false
	if _, ok := rt.(upperExporter); ok && parent.Runtime == "runsc" {
		// runsc keeps rootfs writes inside the sandbox: export them while it runs.
		exports = true
		if layer, err = d.captureUpper(tctx, parent, true); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	mode, reason := ForkMemory, ""
	limit := d.checkpointTimeout(parent)
	cctx, ccancel := context.WithTimeout(tctx, limit)
	err = d.checkpointTo(cctx, parent, img)
	timedOut := err != nil && cctx.Err() != nil
	ccancel()
	if err != nil {
		mode, reason = ForkDisk, "memory checkpoint failed: "+shortError(err)
		if timedOut {
			reason = fmt.Sprintf("memory checkpoint did not finish within %s; the runtime's checkpoint helper was killed", limit)
		}
		d.log.Warn("fork checkpoint failed", "sandbox_id", parent.ID, "err", err)
		_ = os.RemoveAll(d.snapshotDir(snapID))
		// The rest of the fork runs on a fresh context: the checkpoint may
		// have used up this one.
		cancel()
		tctx, cancel = teardownCtx(ctx)
		d.thawAfterCheckpoint(tctx, parent)
		if err := d.ensureRunning(tctx, parent, timedOut); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	if !exports {
		// runc: the container is stopped (memory) or running (disk); copy the host upper.
		if layer, err = d.captureUpper(tctx, parent, mode == ForkDisk); err != nil {
			if mode == ForkMemory {
				err = errors.Join(err, d.restoreParent(tctx, parent, img))
			}
			return store.Snapshot{}, "", "", err
		}
	}
	if mode == ForkMemory {
		if err := d.restoreParent(tctx, parent, img); err != nil {
			return store.Snapshot{}, "", "", err
		}
	}
	memPath := ""
	if mode == ForkMemory {
		memPath = img
	}
	sn, err := d.recordSnapshot(tctx, snapID, parent, "", actor, layer, base, memPath, time.Since(start))
	return sn, mode, reason, err
}

// checkpointTo quiesces the agent and writes a memory image of sb to img.
// The container stops; its filesystem stays mounted.
func (d *Daemon) checkpointTo(ctx context.Context, sb *sandbox.Sandbox, img string) error {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return err
	}
	if err := d.quiesceAgent(ctx, sb.ID); err != nil {
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
func (d *Daemon) ensureRunning(ctx context.Context, sb *sandbox.Sandbox, killed bool) error {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	if st, err := rt.State(ctx, sb.ID); err == nil && st.State == "running" && !killed {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := d.AgentClient(sb.ID).WaitReady(wctx, 10*time.Millisecond); err == nil {
			return nil
		}
	}
	d.Event(ctx, sb, "berth", "fork", "parent_rebooted", "the failed checkpoint stopped or disturbed the parent; it was booted again from its workspace", nil)
	_ = d.halt(ctx, sb)
	if err := d.boot(ctx, sb, nil); err != nil {
		d.fail(ctx, sb, "fork_failed", err)
		return err
	}
	return nil
}

// restoreParent starts the parent again from the fork's memory image; if
// that fails it boots from its workspace, and says so.
func (d *Daemon) restoreParent(ctx context.Context, sb *sandbox.Sandbox, img string) error {
	count := sb.RestoreCount + 1
	lowers, err := d.lowersForID(ctx, sb)
	if err == nil {
		err = d.restoreFrom(ctx, sb, lowers, img, count, "", 0)
	}
	if err == nil {
		_, err = d.store.UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
			s.RestoreCount = count
			return nil
		})
		return err
	}
	d.log.Warn("fork: parent restore failed; booting it from its workspace", "sandbox_id", sb.ID, "err", err)
	d.Event(ctx, sb, "berth", "fork", "parent_rebooted", "restoring the parent from the fork image failed: "+shortError(err), nil)
	rt, _ := d.RuntimeFor(sb)
	if rt != nil {
		_ = rt.Delete(ctx, sb.ID)
	}
	if err := d.boot(ctx, sb, nil); err != nil {
		d.fail(ctx, sb, "fork_failed", err)
		return err
	}
	return nil
}

func (d *Daemon) lowersForID(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	tpl, err := d.store.GetTemplate(ctx, sb.Template)
	if err != nil && len(sb.Layers) == 0 {
		return nil, err
	}
	return d.lowersFor(sb, &tpl)
}

// restoreFrom starts sb (whose filesystem is prepared, or is prepared here
// over lowers) from memory image img and wakes its agent. imageOf is the
// sandbox whose agent the image holds when it is not sb (a fork's parent):
// that agent authenticates with the parent's key once, and is rekeyed to
// sb's own id and key over the authenticated channel before sb is handed out.
func (d *Daemon) restoreFrom(ctx context.Context, sb *sandbox.Sandbox, lowers []string, img string, count int, imageOf string, diskMiB int64) error {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	dir := d.SandboxDir(sb.ID)
	var root string
	if diskMiB > 0 {
		if err := d.pickUserNS(ctx, sb); err != nil {
			return err
		}
		if err := d.shareSandboxDir(sb); err != nil {
			return err
		}
		root, err = rootfs.Prepare(ctx, dir, lowers, diskMiB, d.userNSOf(sb))
	} else {
		root, err = rootfs.Remount(ctx, dir, lowers, d.userNSOf(sb))
	}
	if err != nil {
		return err
	}
	if err := d.netUp(ctx, sb, root); err != nil {
		return err
	}
	ch, err := d.openChannel(sb.ID)
	if err != nil {
		return err
	}
	req := agentapi.RestoredRequest{RestoreCount: count}
	if imageOf != "" && imageOf != sb.ID {
		forget := ch.Allow(imageOf, d.agentKey(imageOf))
		defer forget()
		req.SandboxID, req.Key = sb.ID, hex.EncodeToString(d.agentKey(sb.ID))
	}
	if err := d.boundedRestore(ctx, rt, sb, d.spec(sb, nil, root), img); err != nil {
		return err
	}
	if err := rt.Kill(ctx, sb.ID, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("wake agent: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, d.cfg.ReadyTimeout)
	defer cancel()
	c := ch.Client()
	if _, err := c.WaitReady(wctx, 5*time.Millisecond); err != nil {
		return err
	}
	req.HostTime = time.Now()
	return c.Restored(ctx, req)
}

// forkChild makes one child of parent from snapshot sn.
func (d *Daemon) forkChild(ctx context.Context, parent *sandbox.Sandbox, sn store.Snapshot, mode, actor string, gen int) (*sandbox.Sandbox, error) {
	lineage := sandbox.Attrs{
		Lineage: sandbox.Lineage{Parent: parent.ID, Generation: gen, ForkMode: mode},
		Net:     inheritedNet(parent), // children keep the parent's policy and grants
	}
	if mode == ForkDisk {
		ttl := parent.ExpiresAt.Sub(d.cfg.Now())
		if ttl < time.Minute {
			ttl = time.Minute
		}
		sb, err := d.Create(ctx, CreateRequest{
			Owner: parent.Owner, Actor: actor, Runtime: parent.Runtime, TTL: ttl, ExpiryAction: parent.ExpiryAction,
			Resources: parent.Resources, Labels: maps.Clone(parent.Labels), Env: maps.Clone(parent.Env),
			AutoResume: parent.AutoResume, FromSnapshot: sn.ID, Attrs: lineage,
		})
		if err != nil {
			return nil, err
		}
		d.personalizeChild(ctx, sb, parent, sn, mode, actor, "")
		return sb, nil
	}
	return d.forkRestore(ctx, parent, sn, lineage, actor)
}

// forkRestore makes a child from the snapshot's memory image; a child whose
// restore fails boots from the snapshot's files instead (fork_mode disk).
func (d *Daemon) forkRestore(ctx context.Context, parent *sandbox.Sandbox, sn store.Snapshot, attrs sandbox.Attrs, actor string) (*sandbox.Sandbox, error) {
	now := d.cfg.Now()
	attrs.Layers = slices.Clone(sn.Layers)
	attrs.Lineage.Snapshot = sn.ID
	// The memory image was dumped in the parent's user namespace (or none):
	// the child's workspace must be made for the same.
	attrs.UserNS = sandbox.UserNSNone
	if m := d.userNSOf(parent); m != nil {
		attrs.UserNS = m.String()
	}
	sb := &sandbox.Sandbox{
		ID: sandbox.NewID(), Owner: parent.Owner, Template: parent.Template, TemplateID: parent.TemplateID,
		Runtime: parent.Runtime, State: sandbox.Creating, Labels: maps.Clone(parent.Labels), Env: maps.Clone(parent.Env),
		Resources: parent.Resources, CreatedAt: now, ExpiresAt: parent.ExpiresAt, ExpiryAction: parent.ExpiryAction,
		AutoResume: parent.AutoResume, Attrs: attrs,
	}
	sb.AccessTokenHash = d.envdTokenHash(sb.ID, sb.Owner)
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	if !sb.ExpiresAt.After(now.Add(time.Minute)) {
		sb.ExpiresAt = now.Add(time.Minute)
	}
	if err := d.admit(ctx, sb); err != nil { // quota, then the creating intent
		return nil, err
	}
	d.Event(ctx, sb, actor, "transition", "created", "forked from "+parent.ID, map[string]string{"template": sb.Template, "runtime": sb.Runtime})
	unlock := d.Lock(sb.ID)
	defer unlock()
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if err := d.ensureChanDir(sb.ID); err != nil {
		d.fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	lowers, err := d.lowersFor(sb, nil)
	if err == nil {
		err = d.writeEnv(sb)
	}
	if err != nil {
		d.fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	why := ""
	if err := d.restoreFrom(tctx, sb, lowers, sn.MemoryPath, 1, parent.ID, sb.Resources.DiskMiB); err != nil {
		why = "memory restore failed: " + shortError(err)
		d.log.Warn("fork: child restore failed; booting from the snapshot's files", "sandbox_id", sb.ID, "err", err)
		_ = d.halt(tctx, sb)
		if err := d.boot(tctx, sb, nil); err != nil {
			d.fail(tctx, sb, "create_failed", err)
			return nil, err
		}
	}
	out, err := d.Transition(tctx, sb.ID, sandbox.Running, actor, "forked", why, func(s *sandbox.Sandbox) error {
		s.StartedAt = d.cfg.Now()
		if why != "" {
			s.Lineage.ForkMode = ForkDisk
		} else {
			s.RestoreCount = 1
		}
		return nil
	})
	if err != nil {
		d.fail(tctx, sb, "create_failed", err)
		return nil, err
	}
	d.personalizeChild(tctx, out, parent, sn, out.Lineage.ForkMode, actor, why)
	return out, nil
}

// personalizeChild gives a fork its own /etc/machine-id and records the fork.
func (d *Daemon) personalizeChild(ctx context.Context, sb, parent *sandbox.Sandbox, sn store.Snapshot, mode, actor, why string) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := d.AgentClient(sb.ID).WriteFile(wctx, "/etc/machine-id", "root", 0o444, strings.NewReader(hex.EncodeToString(b[:])+"\n")); err != nil {
		d.log.Warn("fork: write machine-id", "sandbox_id", sb.ID, "err", err)
	}
	d.Event(ctx, sb, actor, "fork", "forked", why, map[string]string{
		"parent": parent.ID, "snapshot": sn.ID, "fork_mode": mode, "generation": strconv.Itoa(sb.Lineage.Generation)})
}
