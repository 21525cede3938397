package daemon

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The reaper loop is the admission service's (admission.Reaper); this is
// the core's side of it: the actions it takes and what it asks the core.

// reaperCore gives the reaper loop the core's actions (admission.ReaperCore).
type reaperCore struct{ d *Daemon }

func (c reaperCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	c.d.Event(ctx, sb, actor, typ, reason, msg, data)
}

func (c reaperCore) Activity(ctx context.Context, id string) (agentapi.Activity, error) {
	return c.d.AgentClient(id).Activity(ctx)
}

func (c reaperCore) Exempt(sb *sandbox.Sandbox) bool { return IsPoolMember(sb) }

func (c reaperCore) LeaseUntil(sb *sandbox.Sandbox) time.Time { return LeaseUntil(sb) }

func (c reaperCore) Pause(ctx context.Context, sb *sandbox.Sandbox, mode sandbox.PauseMode, reason string) error {
	if mode == "" {
		mode = c.d.ckpt.DefaultMode(sb)
	}
	_, err := c.d.ckpt.PauseAs(ctx, "", sb.ID, mode, "reaper", reason)
	return err
}

func (c reaperCore) Stop(ctx context.Context, id, reason string) error {
	_, err := c.d.Stop(ctx, "", id, "reaper", reason)
	return err
}

func (c reaperCore) Delete(ctx context.Context, id, reason string) error {
	return c.d.delete(ctx, "", id, "reaper", reason)
}

// DemoteToDisk turns a memory or freeze pause into a disk pause: the frozen
// processes are killed (SIGKILL while frozen, so no user code runs again)
// and any memory image is removed. The workspace stays: disk is the promise.
func (c reaperCore) DemoteToDisk(ctx context.Context, id, reason string) error {
	d := c.d
	unlock := d.Lock(id)
	defer unlock()
	sb, err := d.Visible(ctx, "", id)
	if err != nil {
		return err
	}
	if sb.State != sandbox.Paused || sb.PauseActual == sandbox.PauseDisk {
		return nil
	}
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if sb.PauseActual == sandbox.PauseFreeze {
		if rt, err := d.RuntimeFor(sb); err == nil {
			_ = rt.Kill(tctx, id, syscall.SIGKILL)
			_ = rt.Thaw(tctx, id)
		}
	}
	if err := d.halt(tctx, sb); err != nil {
		return errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "demote %s to a disk pause", id)
	}
	_ = os.RemoveAll(d.ckpt.MemoryDir(id))
	out, err := d.store.UpdateSandbox(tctx, id, func(s *sandbox.Sandbox) error {
		s.PauseActual = sandbox.PauseDisk
		s.Reason = reason
		return nil
	})
	if err != nil {
		return err
	}
	d.Event(tctx, out, "reaper", "pause_mode", reason, "paused to disk: processes ended, workspace kept",
		map[string]string{"from": string(sb.PauseActual), "to": string(sandbox.PauseDisk)})
	return nil
}
