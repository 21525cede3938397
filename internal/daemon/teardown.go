package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// A delete answers once its intent is durable (the row is "deleted") and
// the sandbox's processes are dead; the rest of its teardown — the
// runtime's container state and cgroups, the network namespace and veth,
// the overlay, the workspace mount and its loop device, the directory,
// the timeline's checkpoints and finally the row — is finished here, by a
// bounded number of workers. Measured on the 2-core CI host (tiny, runc):
// `runc delete --force` of a running container 110 ms of which 100 are
// its poll for the exit, the network 30–37 ms, unmounts 8–30 ms, the
// directory 4–60 ms; the kill through a pidfd 1–3 ms.
//
// Ordering. Every resource of a sandbox is named by its id (cgroup path,
// runtime state, netns, veth, sandbox dir; the loop device is the mount's
// and goes with it) and the row stays until the teardown ends, so nothing
// can be made again under that id meanwhile: a create that names the id
// finds the row and is refused (errs.AlreadyExists), and no other
// operation sees a deleted sandbox (Visible). A crash in between leaves a
// deleted row, which Reconcile finishes (reconcileOne).

// reclaimWorkers is how many teardowns run at once: they are mostly
// kernel work (unmounts, netlink, cgroup removal), two is what this
// project's 2-core hosts serve without slowing the creates beside them.
const reclaimWorkers = 2

// reclaimQueue bounds the teardowns waiting for a worker; a delete that
// finds the queue full does its teardown itself (backpressure: answers
// slow down instead of host resources piling up without bound).
const reclaimQueue = 128

// reclaimDrain bounds how long Close waits for queued teardowns; what is
// left is finished by the next start's Reconcile.
const reclaimDrain = 20 * time.Second

// killWait bounds the wait for a killed sandbox's processes to exit.
const killWait = 5 * time.Second

// processKiller is a runtime that can end a container's processes without
// an exec of itself (oci.OCI: SIGKILL through pidfds to the namespace inits
// of its cgroup). nil means no process of the container runs.
type processKiller interface {
	KillProcesses(ctx context.Context, id string, wait time.Duration) error
}

// reclaimer runs the second half of deletes (finishDelete) in the
// background. Its lock guards open and the send on queue.
type reclaimer struct {
	d     *Daemon
	mu    sync.Mutex
	open  bool
	queue chan *sandbox.Sandbox
	idle  sync.WaitGroup // one per worker; Done when it has exited
	busy  sync.WaitGroup // one per queued or running teardown
}

// startReclaimer starts the workers on the daemon's lifetime: a cancelled
// lifetime (a crash in the tests, the end of Close's drain) stops them
// between two steps, leaving what is left to Reconcile.
func startReclaimer(d *Daemon) *reclaimer {
	r := &reclaimer{d: d, open: true, queue: make(chan *sandbox.Sandbox, reclaimQueue)}
	for range reclaimWorkers {
		r.idle.Add(1)
		d.GoBackground("reclaim", func(ctx context.Context) {
			defer r.idle.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case sb, ok := <-r.queue:
					if !ok {
						return
					}
					d.finishDelete(ctx, sb)
					r.busy.Done()
				}
			}
		})
	}
	return r
}

// enqueue hands a deleted sandbox's teardown to a worker; false when the
// queue is full or closed, and the caller then does it itself.
func (r *reclaimer) enqueue(sb *sandbox.Sandbox) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open {
		return false
	}
	r.busy.Add(1)
	select {
	case r.queue <- sb:
		return true
	default:
		r.busy.Done()
		return false
	}
}

// settle waits until no teardown is queued or running (tests: the host
// state a delete promises, once it has been kept).
func (r *reclaimer) settle() { r.busy.Wait() }

// close stops taking teardowns and waits, at most bound, for the queued
// ones to finish. It reports whether they all did.
func (r *reclaimer) close(bound time.Duration) bool {
	r.mu.Lock()
	if r.open {
		r.open = false
		close(r.queue)
	}
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { r.idle.Wait(); close(done) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// steps times the phases of one teardown for the debug log, as the boot
// logs fs_ms, run_ms and ready_ms: where a delete's time goes must be
// answerable from the daemon's own log.
type steps struct {
	last  time.Time
	attrs []any
}

func startPhases() *steps { return &steps{last: time.Now()} }

// mark ends the phase called name (a log key ending in _ms).
func (p *steps) mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.attrs = append(p.attrs, name, ms(now.Sub(p.last)))
	p.last = now
}

func (p *steps) log(ctx context.Context, l *slog.Logger, msg string, attrs ...any) {
	l.DebugContext(ctx, msg, append(attrs, p.attrs...)...)
}

// endProcesses makes sure no process of sb runs: its agent channel is
// closed and its processes killed through the runtime's killer when it has
// one, else (or when that cannot tell) by the runtime's delete; deleted
// says the container is gone too.
func (d *Daemon) endProcesses(ctx context.Context, sb *sandbox.Sandbox) (deleted bool, err error) {
	d.chans.drop(sb.ID)
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return false, err
	}
	if k, ok := rt.(processKiller); ok {
		err := k.KillProcesses(ctx, sb.ID, killWait)
		if err == nil {
			return false, nil
		}
		d.log.Debug("kill before delete", "sandbox_id", sb.ID, "err", err)
	}
	return true, rt.Delete(ctx, sb.ID)
}

// halt stops PID 1 and unmounts the filesystem, keeping the workspace image.
func (d *Daemon) halt(ctx context.Context, sb *sandbox.Sandbox) error {
	return d.haltPhases(ctx, sb, nil)
}

// haltPhases is halt, recording its steps in ph when ph is not nil. The
// processes are killed first: `runc delete --force` of a running container
// signals it and then polls every 100 ms for its exit.
func (d *Daemon) haltPhases(ctx context.Context, sb *sandbox.Sandbox, ph *steps) error {
	var errList []error
	deleted, err := d.endProcesses(ctx, sb)
	errList = append(errList, err)
	ph.mark("kill_ms")
	if rt, err := d.RuntimeFor(sb); err == nil && !deleted {
		errList = append(errList, rt.Delete(ctx, sb.ID))
	}
	ph.mark("runtime_delete_ms")
	errList = append(errList, d.net.Down(ctx, sb))
	ph.mark("net_ms")
	errList = append(errList, d.cfg.Filesystem.Teardown(ctx, d.SandboxDir(sb.ID)))
	ph.mark("fs_ms")
	return errors.Join(errList...)
}

// destroy halts a sandbox and removes its directory.
func (d *Daemon) destroy(ctx context.Context, sb *sandbox.Sandbox) error {
	return d.destroyPhases(ctx, sb, nil)
}

func (d *Daemon) destroyPhases(ctx context.Context, sb *sandbox.Sandbox, ph *steps) error {
	if err := d.haltPhases(ctx, sb, ph); err != nil {
		return err
	}
	err := d.chans.removeSandboxDir(sb.ID)
	ph.mark("rmdir_ms")
	return err
}

// finishDelete is a worker's run of reclaim, under the sandbox's lock.
func (d *Daemon) finishDelete(life context.Context, sb *sandbox.Sandbox) {
	unlock := d.Lock(sb.ID)
	defer unlock()
	d.reclaim(life, sb)
}

// reclaim is the part of a delete after its answer: everything of sb on
// the host, its timeline, then its row. On failure the row stays "deleted"
// and the next start's Reconcile tries again. The caller holds sb's lock.
// life is the daemon's lifetime: once it ends, the teardown stops between
// two steps and Reconcile finishes it.
func (d *Daemon) reclaim(life context.Context, sb *sandbox.Sandbox) {
	ph := startPhases()
	tctx, cancel := teardownCtx(life)
	defer cancel()
	stop := context.AfterFunc(life, cancel)
	defer stop()
	if err := d.destroyPhases(tctx, sb, ph); err != nil {
		d.log.Error("teardown of a deleted sandbox; the next start finishes it", "sandbox_id", sb.ID, "err", err)
		return
	}
	if err := d.tl.Forget(tctx, sb.ID); err != nil { // its checkpoints and their layers
		d.log.Warn("forget timeline", "sandbox_id", sb.ID, "err", err)
	}
	ph.mark("forget_ms")
	if err := d.store.DeleteSandbox(tctx, sb.ID); err != nil {
		d.log.Error("remove a deleted sandbox's row; the next start does", "sandbox_id", sb.ID, "err", err)
		return
	}
	ph.mark("store_delete_ms")
	d.locksMu.Lock()
	delete(d.locks, sb.ID)
	d.locksMu.Unlock()
	ph.log(life, d.log, "sandbox teardown finished", "sandbox_id", sb.ID, "runtime", sb.Runtime)
}
