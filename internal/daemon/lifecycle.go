package daemon

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// Get returns one sandbox visible to owner ("" = admin).
func (d *Daemon) Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return d.Visible(ctx, owner, id)
}

// List returns sandboxes matching the filter and a cursor for the next page.
func (d *Daemon) List(ctx context.Context, f ListFilter) ([]*sandbox.Sandbox, string, error) {
	for _, s := range f.States {
		if !sandbox.ValidState(string(s)) {
			return nil, "", errs.Field("state", "unknown state %q", s)
		}
	}
	if f.Order != "" && f.Order != "asc" && f.Order != "desc" {
		return nil, "", errs.Field("order", "must be asc or desc, got %q", f.Order)
	}
	if f.Limit < 0 {
		return nil, "", errs.Field("limit", "must not be negative")
	}
	states := f.States
	if len(states) == 0 {
		for _, s := range sandbox.States() {
			if s != sandbox.Deleted {
				states = append(states, s)
			}
		}
	}
	list, next, err := d.store.ListSandboxes(ctx, store.SandboxFilter{
		Owner: f.Owner, States: states, Labels: f.Labels, Template: f.Template,
		CreatedAfter: f.CreatedAfter, Order: f.Order, Limit: f.Limit, After: f.Cursor,
	})
	if f.Owner != PoolOwner { // unclaimed warm pool members are nobody's (pool.go)
		list = slices.DeleteFunc(list, IsPoolMember)
	}
	return list, next, err
}

// Stop halts a sandbox's processes and keeps its workspace.
func (d *Daemon) Stop(ctx context.Context, owner, id, actor, reason string) (*sandbox.Sandbox, error) {
	unlock := d.Lock(id)
	defer unlock()
	sb, err := d.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == sandbox.Stopped {
		return sb, nil
	}
	if err := sandbox.Transition(sb.State, sandbox.Stopped); err != nil {
		return nil, err
	}
	if sb.State == sandbox.Running {
		_ = d.hooks.Fire(ctx, statehook.Event{Phase: statehook.BeforeStop, Sandbox: sb, Actor: actor})
	}
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if err := d.halt(tctx, sb); err != nil {
		return nil, errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "stop sandbox %s", id)
	}
	return d.Transition(tctx, id, sandbox.Stopped, actor, reason, "", nil)
}

// Start boots a stopped (or failed) sandbox again from its workspace.
func (d *Daemon) Start(ctx context.Context, owner, id, actor string) (*sandbox.Sandbox, error) {
	unlock := d.Lock(id)
	defer unlock()
	sb, err := d.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == sandbox.Running {
		return sb, nil
	}
	if sb.State != sandbox.Stopped && sb.State != sandbox.Failed {
		return nil, &sandbox.TransitionError{From: sb.State, To: sandbox.Running}
	}
	if !d.cfg.Now().Before(sb.ExpiresAt) {
		return nil, errs.E(errs.FailedPrecondition, "sandbox %s expired at %s; extend it first (berth extend)", id, sb.ExpiresAt.Format(time.RFC3339))
	}
	// A stopped sandbox holds no CPU or memory: running it again is admitted
	// like a create (quota.go).
	release, err := d.adm.ReserveStart(ctx, sb)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := d.boot(ctx, sb, nil); err != nil {
		d.fail(ctx, sb, "start_failed", err)
		return nil, err
	}
	return d.Transition(ctx, id, sandbox.Running, actor, "started", "", func(s *sandbox.Sandbox) error {
		s.StartedAt = d.cfg.Now()
		return nil
	})
}

// Delete removes every trace of a sandbox on the host: processes, mounts,
// cgroups, sockets, directories. The record is kept as an event trail. It
// answers once the sandbox is recorded as deleted and its processes are
// dead; the rest of the teardown finishes in the background (teardown.go).
func (d *Daemon) Delete(ctx context.Context, owner, id string) error {
	return d.delete(ctx, owner, id, owner, "deleted")
}

// DeleteAs is Delete as the admin by actor, whose reason the events
// record (cluster mode's node agent deleting a sandbox whose object is
// gone or lost).
func (d *Daemon) DeleteAs(ctx context.Context, id, actor, reason string) error {
	return d.delete(ctx, "", id, actor, reason)
}

func (d *Daemon) delete(ctx context.Context, owner, id, actor, reason string) error {
	ph := startPhases()
	// Looked up before the lock too: a sandbox already deleted answers
	// not_found at once, not after its background teardown (which holds
	// the lock).
	if _, err := d.Visible(ctx, owner, id); err != nil {
		return err
	}
	unlock := d.Lock(id)
	defer unlock()
	sb, err := d.Visible(ctx, owner, id)
	if err != nil {
		return err
	}
	ph.mark("lock_ms")
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	d.merges.TargetDeleted(tctx, id) // its open merge is aborted (internal/merges)
	ph.mark("merges_ms")
	if _, err := d.endProcesses(tctx, sb); err != nil {
		return errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "delete sandbox %s", id)
	}
	ph.mark("kill_ms")
	// From here the daemon owes the teardown, across a crash too
	// (Reconcile finishes a deleted row).
	if _, err := d.Transition(tctx, id, sandbox.Deleted, actor, reason, "", nil); err != nil {
		return err
	}
	ph.mark("transition_ms")
	if !d.reclaimer.enqueue(sb) {
		d.reclaim(d.bg, sb) // queue full or closing: this delete does it
		ph.mark("inline_teardown_ms")
	}
	ph.log(ctx, d.log, "sandbox deleted", "sandbox_id", id, "runtime", sb.Runtime)
	return nil
}

// SetExpiry moves a sandbox's expiry (shorter or longer, capped at the server maximum).
func (d *Daemon) SetExpiry(ctx context.Context, owner, id string, at time.Time) (*sandbox.Sandbox, error) {
	if _, err := d.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	now := d.cfg.Now()
	if at.Before(now) {
		at = now
	}
	if max := now.Add(d.cfg.MaxTTL); at.After(max) {
		return nil, errs.Field("ttl", "must be at most %s", d.cfg.MaxTTL)
	}
	out, err := d.store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		sb.ExpiresAt = at
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.Event(ctx, out, owner, "expiry", "extended", "", map[string]string{"expires_at": at.UTC().Format(time.RFC3339)})
	return out, nil
}

// Agent returns a client for a running sandbox's agent.
func (d *Daemon) Agent(ctx context.Context, owner, id string) (*agentapi.Client, error) {
	sb, err := d.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	d.adm.NoteAPI(id) // reaper signal: last API activity
	if sb.State == sandbox.Paused && sb.AutoResume {
		if _, err := d.ckpt.ResumeAs(ctx, owner, id, "auto-resume", false); err != nil && !errs.Is(err, errs.Conflict) {
			return nil, err
		}
		if sb, err = d.Visible(ctx, owner, id); err != nil {
			return nil, err
		}
	}
	if sb.State != sandbox.Running {
		return nil, errs.E(errs.Unavailable, "sandbox %s is %s, not running", id, sb.State)
	}
	return d.AgentClient(id), nil
}

// Lease keeps a sandbox from expiring (and from being reaped) until now+dur,
// without ping loops. A zero duration releases the lease.
func (d *Daemon) Lease(ctx context.Context, owner, id string, dur time.Duration) (*sandbox.Sandbox, error) {
	if dur < 0 || dur > d.cfg.MaxTTL {
		return nil, errs.Field("for", "must be between 0 and %s", d.cfg.MaxTTL)
	}
	if _, err := d.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	until := d.cfg.Now().Add(dur)
	out, err := d.store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		sb.LeaseUntil = time.Time{}
		if dur > 0 {
			sb.LeaseUntil = until.UTC()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	reason := "lease_acquired"
	if dur == 0 {
		reason = "lease_released"
	}
	d.Event(ctx, out, owner, "lease", reason, "", map[string]string{"until": until.UTC().Format(time.RFC3339), "for": dur.String()})
	return out, nil
}

// LeaseUntil returns the active lease's end, or the zero time.
func LeaseUntil(sb *sandbox.Sandbox) time.Time {
	return sb.LeaseUntil
}
