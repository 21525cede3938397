package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/internal/errs"
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
	for _, sb := range all {
		known[sb.ID] = true
		if err := d.snaps.PinLegacy(ctx, sb); err != nil { // internal/checkpoint/pin.go
			d.log.Error("pin layers", "sandbox_id", sb.ID, "err", err)
			errList = append(errList, err)
		}
		if err := d.reconcileOne(ctx, sb); err != nil {
			d.log.Error("reconcile", "sandbox_id", sb.ID, "err", err)
			errList = append(errList, err)
		}
	}
	// Orphans: runtime containers and directories nobody owns.
	for name, rt := range d.runtimes {
		sts, err := rt.List(ctx)
		if err != nil {
			errList = append(errList, errs.Wrap(errs.Internal, err, "list %s containers", name))
			continue
		}
		for _, st := range sts {
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
		errList = append(errList, os.RemoveAll(dir))
	}
	errList = append(errList, d.reconcileNetwork(ctx))
	return errors.Join(errList...)
}

func (d *Daemon) reconcileOne(ctx context.Context, sb *sandbox.Sandbox) error {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	st, stErr := rt.State(ctx, sb.ID)
	alive := stErr == nil && (st.State == "running" || st.State == "paused")
	healthy := func() bool {
		if !alive || st.State != "running" {
			return false
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

// Run starts the daemon's background loops (expiry, health/OOM watch).
func (d *Daemon) Run() {
	d.GoBackground("expiry", d.expiryLoop)
	d.GoBackground("watch", d.watchLoop)
	d.GoBackground("pools", d.poolLoop)    // pool_fill.go
	d.GoBackground("reaper", d.reaperLoop) // reaper.go: signals, metering, idle ladder
}

func (d *Daemon) expiryLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.expireDue(ctx)
		}
	}
}

// expireDue applies the expiry action of every sandbox past its expiry.
func (d *Daemon) expireDue(ctx context.Context) {
	now := d.cfg.Now()
	list, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running, sandbox.Paused}})
	if err != nil {
		d.log.Error("expiry scan", "err", err)
		return
	}
	for _, sb := range list {
		if now.Before(sb.ExpiresAt) || now.Before(LeaseUntil(sb)) {
			continue
		}
		if err := d.expire(ctx, sb); err != nil && !errs.Is(err, errs.NotFound) {
			d.log.Error("expire", "sandbox_id", sb.ID, "err", err)
		}
	}
}

func (d *Daemon) expire(ctx context.Context, sb *sandbox.Sandbox) error {
	switch sb.ExpiryAction {
	case sandbox.ExpireDelete:
		return d.delete(ctx, "", sb.ID, "expiry", "expired")
	case sandbox.ExpirePause:
		if sb.State == sandbox.Paused {
			return nil
		}
		_, err := d.ckpt.PauseAs(ctx, "", sb.ID, d.ckpt.DefaultMode(sb), "expiry", "expired")
		return err
	default:
		if sb.State == sandbox.Stopped {
			return nil
		}
		_, err := d.Stop(ctx, "", sb.ID, "expiry", "expired")
		return err
	}
}

// watchLoop notices sandboxes whose PID 1 died and OOM kills inside them.
func (d *Daemon) watchLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	ooms := map[string]uint64{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		list, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running}})
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, sb := range list {
			seen[sb.ID] = true
			d.watchOne(ctx, sb, ooms)
		}
		for id := range ooms {
			if !seen[id] {
				delete(ooms, id)
			}
		}
	}
}

func (d *Daemon) watchOne(ctx context.Context, sb *sandbox.Sandbox, ooms map[string]uint64) {
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return
	}
	if st, err := rt.Stats(ctx, sb.ID); err == nil {
		if st.OOMKills > ooms[sb.ID] {
			if _, had := ooms[sb.ID]; had || st.OOMKills > 0 {
				d.Event(ctx, sb, "kernel", "oom", "oom_kill", "a process was killed for exceeding the memory limit",
					map[string]string{"memory_limit_mib": formatInt(sb.Resources.MemoryMiB)})
			}
		}
		ooms[sb.ID] = st.OOMKills
	}
	unlock := d.Lock(sb.ID)
	defer unlock()
	cur, err := d.store.GetSandbox(ctx, sb.ID)
	if err != nil || cur.State != sandbox.Running {
		return
	}
	if st, err := rt.State(ctx, sb.ID); err == nil && (st.State == "running" || st.State == "paused") {
		return
	}
	d.fail(ctx, cur, "exited", errors.New("the sandbox's init process exited"))
}
