package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Reconcile makes the host match the store after a (possibly unclean)
// restart: adopt what still runs, finish or clean up half-done work, record
// what died, and remove anything the store does not know about.
func (d *Daemon) Reconcile(ctx context.Context) error {
	all, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var errList []error
	// Merges a crash interrupted first: their targets may still be frozen.
	errList = append(errList, d.merges.Recover(ctx))
	// Listen on the channel of every sandbox recorded as running before
	// anything else: its agent has redialled every 200 ms since the old
	// daemon stopped, and at 1,000 sandboxes that storm slowed the runtime
	// List below tenfold (10.8 s). One whose container is gone fails in
	// reconcileOne, which drops its channel.
	for _, sb := range all {
		if sb.State == sandbox.Running || sb.State == sandbox.Creating {
			if _, err := d.RuntimeFor(sb); err == nil {
				_, _ = d.chans.get(sb.ID)
			}
		}
	}
	// One List per runtime (after the merges: they thaw what they froze)
	// instead of a State per sandbox: with runc each is a process, and a
	// restart over 1,000 sandboxes spent its time starting `runc state`.
	listed := map[string]map[string]runtime.Status{}
	for name, rt := range d.runtimes {
		sts, err := rt.List(ctx)
		if err != nil {
			errList = append(errList, errs.Wrap(errs.Internal, err, "list %s containers", name))
			continue
		}
		m := make(map[string]runtime.Status, len(sts))
		for _, st := range sts {
			m[st.ID] = st
		}
		listed[name] = m
	}
	// Every live sandbox's channel listens before any is settled (above):
	// its agent redials within 200 ms of a listener appearing, so all of
	// them connect at once instead of one after the other as the loop
	// reaches each (~150 ms per sandbox, minutes at 1,000).
	var live []string
	for _, sb := range all {
		if sb.State != sandbox.Running && sb.State != sandbox.Creating {
			continue
		}
		if rt, err := d.RuntimeFor(sb); err == nil && listed[rt.Name()][sb.ID].State == "running" {
			live = append(live, sb.ID)
		}
	}
	// And wait for them together: one agent round trip each, which on a
	// loaded host is mostly waiting to be scheduled, not work.
	ready := d.agentsReady(ctx, live)
	for _, sb := range all {
		known[sb.ID] = true
		if err := d.snaps.PinLegacy(ctx, sb); err != nil { // internal/checkpoint/pin.go
			d.log.Error("pin layers", "sandbox_id", sb.ID, "err", err)
			errList = append(errList, err)
		}
		runState := ""
		if rt, err := d.RuntimeFor(sb); err == nil {
			runState = listed[rt.Name()][sb.ID].State // "" when not listed: Recover asks
		}
		if err := d.tl.Recover(ctx, sb, runState); err != nil { // a rewind or promote the crash interrupted
			d.log.Error("settle timeline restart", "sandbox_id", sb.ID, "err", err)
			errList = append(errList, err)
		}
		if err := d.reconcileOne(ctx, sb, listed, ready); err != nil {
			d.log.Error("reconcile", "sandbox_id", sb.ID, "err", err)
			errList = append(errList, err)
		}
	}
	// Orphans: runtime containers and directories nobody owns.
	for name, rt := range d.runtimes {
		for _, st := range listed[name] {
			if !known[st.ID] {
				d.log.Warn("removing orphan container", "sandbox_id", st.ID, "runtime", name)
				errList = append(errList, rt.Delete(ctx, st.ID))
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(d.cfg.DataDir, "sandboxes"))
	for _, e := range entries {
		if known[e.Name()] {
			continue
		}
		dir := filepath.Join(d.cfg.DataDir, "sandboxes", e.Name())
		d.log.Warn("removing orphan sandbox directory", "sandbox_id", e.Name())
		if err := d.cfg.Filesystem.Teardown(ctx, dir); err != nil {
			errList = append(errList, err)
			continue
		}
		errList = append(errList, d.chans.removeSandboxDir(e.Name()))
	}
	if d.chans.shared != "" { // channel dirs of sandboxes nobody owns
		chanEntries, _ := os.ReadDir(d.chans.shared)
		for _, e := range chanEntries {
			if !known[e.Name()] {
				d.log.Warn("removing orphan channel directory", "sandbox_id", e.Name())
				errList = append(errList, os.RemoveAll(filepath.Join(d.chans.shared, e.Name())))
			}
		}
	}
	errList = append(errList, d.tl.Sweep(ctx)) // images no checkpoint owns
	errList = append(errList, d.net.Reconcile(ctx))
	return errors.Join(errList...)
}

// reconcileOne settles one sandbox; listed is what each runtime's List
// reported at the start of Reconcile (a runtime missing from it, or a
// container not in its list, is asked directly), ready whether each agent
// already asked answered (the others are waited for here).
func (d *Daemon) reconcileOne(ctx context.Context, sb *sandbox.Sandbox, listed map[string]map[string]runtime.Status, ready map[string]bool) error {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	st, ok := listed[rt.Name()][sb.ID]
	var stErr error
	// Not listed, or listed frozen while it should run (Recover may have
	// thawed it since): the runtime is asked.
	if !ok || (st.State == "paused" && sb.State != sandbox.Paused) {
		st, stErr = rt.State(ctx, sb.ID)
	}
	alive := stErr == nil && (st.State == "running" || st.State == "paused")
	healthy := func() bool {
		if !alive || st.State != "running" {
			return false
		}
		if ok, asked := ready[sb.ID]; asked {
			return ok
		}
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := d.AgentClient(sb.ID).WaitReady(hctx, 50*time.Millisecond)
		return err == nil
	}
	switch sb.State {
	case sandbox.Deleted:
		if err := d.destroy(ctx, sb); err != nil {
			return err
		}
		if err := d.tl.Forget(ctx, sb.ID); err != nil {
			d.log.Warn("forget timeline", "sandbox_id", sb.ID, "err", err)
		}
		return d.store.DeleteSandbox(ctx, sb.ID)
	case sandbox.Creating:
		if healthy() {
			_, err := d.Transition(ctx, sb.ID, sandbox.Running, "berth", "adopted", "create finished across a daemon restart", func(s *sandbox.Sandbox) error {
				s.StartedAt = d.cfg.Now()
				return nil
			})
			return err
		}
		d.fail(ctx, sb, "create_interrupted", errors.New("the daemon stopped while the sandbox was being created"))
		return nil
	case sandbox.Running:
		if healthy() {
			return nil
		}
		d.fail(ctx, sb, "died_while_daemon_down", errors.New("the sandbox's processes were gone when the daemon restarted"))
		return nil
	case sandbox.Stopped, sandbox.Failed:
		if alive || stErr == nil {
			return d.halt(ctx, sb)
		}
		return nil
	default:
		return d.ckpt.ReconcilePaused(ctx, sb, alive)
	}
}

// Run starts the daemon's background loops: expiry and the PID-1 watch
// (watch.go), the warm pools' fill loop and the reaper (signals, metering,
// idle ladder; admission.Reaper with reaperCore, reaper.go).
func (d *Daemon) Run() {
	d.GoBackground("expiry", d.watch.expiryLoop)
	d.GoBackground("watch", d.watch.watchLoop)
	d.GoBackground("pools", d.poolSvc.Run)
	d.GoBackground("reaper", d.adm.NewReaper(reaperCore{d}).Run)
	d.GoBackground("activity", d.act.Run)
	d.GoBackground("audit", d.audit.Run)
}

// agentsReady waits for the agents of ids, a few at a time, each for the
// 3 s reconcileOne would give it: id → whether it answered.
func (d *Daemon) agentsReady(ctx context.Context, ids []string) map[string]bool {
	ready := make(map[string]bool, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := d.AgentClient(id).WaitReady(hctx, 50*time.Millisecond)
			mu.Lock()
			ready[id] = err == nil
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ready
}
