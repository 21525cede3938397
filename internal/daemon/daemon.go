// Package daemon is berth's lifecycle core on one host: it turns API
// requests into store intents, runtime effects and events (create, start,
// stop, delete, exec and files through the agent), owns the state table's
// transitions, reconciles the store against the runtime after a crash, and
// runs expiry and the PID-1 watch (watcher, watch.go). It owns the
// per-sandbox lock, the agent-channel registry (channels, channel.go) and
// the runc user-namespace choice (userNamespaces, userns.go).
//
// The domains around it are services of their own, each reaching the core
// through a narrow interface declared on its side and exposed here by one
// accessor: checkpoint (Checkpoints, Snapshots; checkpointCore,
// checkpoint_core.go), template (Templates; templateCore, templates.go),
// pool (Pools; poolCore, pool.go), hostnet (Net), admission (Admission; the
// reaper loop through reaperCore, reaper.go) and auth (Auth). The adapters
// carry the lifecycle steps a service needs, so those steps are not API of
// the Daemon; the lifecycle code calls the services directly (d.net.Up,
// d.adm.Admit, d.auth.EnvdTokenHash). docs/LAYOUT.md has the map.
//
// # Lock order
//
// Locks of the core and of the services it calls, outermost first. A lock
// is only ever taken while holding locks above it in this list, never one
// below it; while a leaf lock (4) is held no other lock of this list is
// taken.
//
//  1. template GC (template's templateWork.gc, an RWMutex): read-held by an
//     import or build for its whole run, which may create and boot a build
//     sandbox (taking 2); write-held by layer GC, which takes nothing else.
//  2. a sandbox's lock (Daemon.Lock(id)): serialises lifecycle operations
//     on one sandbox; held across a whole create, start, stop, delete,
//     pause, resume, snapshot or fork capture, the watcher's check of a
//     running sandbox's PID 1, and after a memory pause by the background
//     release until the sandbox's filesystem and network are released. One
//     operation holds one sandbox's lock at a time: a fork releases its
//     parent's lock before it locks each child. The one exception is a
//     diff of two sandboxes that are not running (internal/lineage reads
//     their workspace images under their locks): it takes both in id
//     order and nothing else while it holds them.
//  3. admission (admission.Service.admitMu): quota check + intent insert;
//     taken with a sandbox's lock held (start, fork, snapshot reservations).
//     A warm-pool claim is the one inversion: it holds admitMu while it
//     takes a pool member's lock (2); pool members are never started,
//     forked or snapshotted by owners, so the two orders never meet on one
//     sandbox.
//  4. leaves, each independent of the others: Daemon.locksMu (finds the
//     per-sandbox mutex inside Lock), channels.mu (the agent-channel
//     registry), checkpoint.Service.pauseMu (streams' pause signals),
//     hostnet.Service.mu (network owners and pending egress log),
//     pool.Service.mu (pool bookkeeping; released before a member is
//     claimed), admission.Service.mu and .mMu (live signals, metrics
//     counters), activity.Service.mu (live execs, drop counts, followers;
//     taken on the exec path, which holds no other lock meanwhile),
//     console.Service.mu (web console sessions; never held across a call),
//     lineage.Service.mu (its runsc host-upper cache), tasks.Service.mu
//     (every task-ledger write; its statehook takes it under a sandbox's
//     lock, the REST routes with no other lock held),
//     effects.Service.mu (the side-effect ledger's scopes and counters;
//     taken on the egress proxy's path and by its hook, under a sandbox's
//     lock; held across store calls only).
//
// internal/merges and internal/timeline have no lock of their own: they
// work under the target sandbox's lock (2); a merge captures its source
// under the source's lock and releases it before it locks the target.
// The watcher and userNamespaces have no lock of their own: the watcher's
// OOM counters belong to its watch loop's goroutine, the user-namespace
// mapping is fixed at New and a sandbox's choice is written under that
// sandbox's lock. The store's transactions are below all of these: a store
// call may be made holding any of 1–3, and the store never calls back into
// the core.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/activity"
	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/audit"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/console"
	"github.com/berth-dev/berth/internal/effects"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/leases"
	"github.com/berth-dev/berth/internal/lineage"
	"github.com/berth-dev/berth/internal/merges"
	"github.com/berth-dev/berth/internal/notes"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/tasks"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/timeline"
)

// Daemon owns every sandbox on this host.
type Daemon struct {
	cfg       Config
	agent     agentInstall
	log       *slog.Logger
	store     store.Store
	runtimes  map[string]runtime.Runtime
	userns    *userNamespaces // runc sandboxes' user namespaces (userns.go)
	templates *template.Store
	auth      *auth.Service // API keys and envd tokens

	locksMu sync.Mutex
	locks   map[string]*sync.Mutex

	chans *channels // agent channels, with their own lock (channel.go)
	watch *watcher  // expiry and the PID-1 watch (watch.go)

	ckpt  *checkpoint.Service   // pause, resume, fork (internal/checkpoint)
	snaps *checkpoint.Snapshots // snapshots and layer pins (internal/checkpoint)
	tl    *timeline.Service     // checkpoints on a timeline, rewind, promote (internal/timeline)

	poolSvc *pool.Service     // warm pools (pool.go)
	tplSvc  *template.Service // template import, pull, build, GC (templates.go)

	adm *admission.Service // quota admission, signals, metering, metrics (admission.go)

	net *hostnet.Service // host networking (hostnet.go)

	act     *activity.Service // activity timelines (internal/activity)
	hooks   *statehook.Bus    // lifecycle moments for the state services (internal/statehook)
	console *console.Service  // web console sessions (console.go)
	lineage *lineage.Service  // views, diff, compare (lineage_core.go)
	merges  *merges.Service   // merges of forks into their targets (merges.go)
	tasks   *tasks.Service    // task ledgers (tasks.go)
	notes   *notes.Service    // handoff notes (notes_core.go)
	audit   *audit.Service    // the audit chain (internal/audit, audit_core.go)
	self    *SelfAPI          // the in-sandbox API's server (selfapi.go)
	effects *effects.Service  // the side-effect ledger (effects.go)
	leases  *leases.Service   // credential leases (leases.go)

	reclaimer *reclaimer // the background half of deletes (teardown.go)

	// bg is the daemon's lifetime: sandboxes and background loops live on it,
	// never on a request's context.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New wires a daemon. runtimes maps backend name ("runc", "runsc") to its implementation.
func New(cfg Config, st store.Store, rts map[string]runtime.Runtime, tpl *template.Store) (*Daemon, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, ok := rts[cfg.DefaultRuntime]; !ok {
		return nil, errs.Field("runtime", "default runtime %q is not available", cfg.DefaultRuntime)
	}
	// Sandbox content (setuid files, device nodes, workspaces) lives below
	// these: no host user but root may traverse them. Existing installs
	// made them 0711, hence the chmod.
	for _, d := range []string{"", "sandboxes", "layers", "snapshots"} {
		p := filepath.Join(cfg.DataDir, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "create data dir")
		}
		if err := os.Chmod(p, 0o700); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "chmod %s", p)
		}
	}
	agent, err := installAgent(cfg.DataDir, cfg.AgentPath)
	if err != nil {
		return nil, err
	}
	tokenKey, err := loadMasterKey(cfg.DataDir, auth.TokenKeyFile, auth.TokenKeySize)
	if err != nil {
		return nil, err
	}
	chanKey, err := loadChannelKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var userNS *rootfs.IDMap
	if _, ok := rts["runc"]; ok {
		if userNS, err = setupUserNS(cfg); err != nil {
			return nil, err
		}
		if userNS != nil {
			if err := raiseKeyQuota(keysDir, cfg.Log); err != nil {
				cfg.Log.Warn("runc sandboxes share one key quota; it could not be raised", "err", err)
			}
		}
	}
	var spares *rootfs.Spares
	if fs, ok := cfg.Filesystem.(overlayFS); ok && cfg.WorkspaceSpares >= 0 {
		keep := cfg.WorkspaceSpares
		if keep == 0 {
			keep = DefaultWorkspaceSpares
		}
		if spares, err = rootfs.NewSpares(filepath.Join(cfg.DataDir, "spares"), cfg.DefaultResources.DiskMiB, keep, cfg.Log); err != nil {
			return nil, err
		}
		fs.spares = spares
		cfg.Filesystem = fs
	}
	bg, cancel := context.WithCancel(context.Background())
	d := &Daemon{
		cfg: cfg, agent: agent, auth: auth.New(st, cfg.DataDir, cfg.Now, tokenKey), log: cfg.Log, store: st, runtimes: rts, templates: tpl,
		userns: &userNamespaces{m: userNS, store: st, log: cfg.Log},
		locks:  map[string]*sync.Mutex{},
		bg:     bg, cancel: cancel,
	}
	d.auth.SetClusterToken(cfg.ClusterToken) // "" on one host: cluster headers refused
	wireCore(d, chanKey)
	if d.audit, err = newAudit(d); err != nil {
		return nil, err
	}
	d.hooks.Register("audit", d.audit) // pause, resume, fork, restore, stop: appended, never rolled back
	rtNames := make([]string, 0, len(rts))
	for n := range rts {
		rtNames = append(rtNames, n)
	}
	d.poolSvc = pool.New(pool.Config{DefaultRuntime: cfg.DefaultRuntime, Runtimes: rtNames,
		DefaultResources: cfg.DefaultResources, MaxResources: cfg.MaxResources}, poolCore{d})
	d.tplSvc = template.NewService(template.ServiceConfig{DefaultTemplate: cfg.DefaultTemplate}, tpl, templateCore{d})
	d.adm = admission.New(d, cfg.admissionConfig())
	d.net = hostnet.New(d, cfg.DataDir, d.auth, d.adm)
	d.net.SetAuditor(d.audit)
	wireLeases(d)
	d.act = activity.New(activity.Config{Retention: cfg.ActivityRetention, Log: cfg.Log, Now: cfg.Now}, activityCore{d}, st)
	// Every agent client reports execs and file changes (activity); execs
	// are also audit entries.
	d.chans.observe = func(id string) agentapi.Observer { return d.audit.Observe(id, d.act.Observer(id)) }
	d.console = console.New(consoleCore{d}, console.Config{Now: cfg.Now})
	d.lineage = lineage.New(lineageCore{d}, lineage.Config{DataDir: cfg.DataDir, Log: cfg.Log})
	d.merges = newMerges(d)
	d.tasks = tasks.New(tasksCore{d}, tasks.Config{Log: d.log, Auditor: d.audit})
	d.hooks.Register("tasks", d.tasks)
	d.effects = newEffects(d)
	d.effects.SetSteps(d.tasks)    // a derived idempotency key names the task step
	d.effects.SetAuditor(d.audit)  // intents, outcomes, replays and refusals
	d.lineage.SetCheckpoints(d.tl) // `berth diff A --checkpoint C`
	d.notes = notes.New(notesCore{d}, st, notes.Config{Log: cfg.Log, Now: cfg.Now})
	d.hooks.Register("notes", d.notes)
	d.reclaimer = startReclaimer(d) // last: an error above must leave no worker behind
	if spares != nil {
		d.GoBackground("workspace spares", spares.Run)
	}
	return d, nil
}

// wireCore builds the parts of the core that need the core itself: its
// channel registry and the checkpoint services (checkpoint_core.go).
func wireCore(d *Daemon, chanKey []byte) {
	d.chans = newChannels(chanKey, d.SandboxDir, d.log)
	_, d.chans.tmpfs = d.cfg.Filesystem.(overlayFS)
	if d.chans.tmpfs {
		if err := d.chans.useShared(filepath.Join(d.cfg.DataDir, "chan"), filepath.Join(d.cfg.DataDir, "sandboxes")); err != nil {
			d.log.Warn("channel dirs stay one tmpfs per sandbox", "err", err)
		}
	}
	d.self = newSelfAPI(d)
	d.chans.callers = d.self.accept // every channel serves its sandbox's in-sandbox API
	d.watch = newWatcher(watchAdapter{d})
	d.hooks = &statehook.Bus{Log: d.log, OnError: func(ctx context.Context, ev statehook.Event, hook string, err error) {
		if ev.Sandbox != nil {
			d.Event(ctx, ev.Sandbox, "berth", "state_degraded", hook, errs.Short(err), map[string]string{"phase": string(ev.Phase)})
		}
	}}
	d.ckpt, d.snaps = checkpoint.New(checkpointCore{d}, checkpoint.Config{
		DataDir: d.cfg.DataDir, ReadyTimeout: d.cfg.ReadyTimeout,
		CheckpointTimeout: d.cfg.CheckpointTimeout, CheckpointTimeoutPerGiB: d.cfg.CheckpointTimeoutPerGiB,
		Lifetime: d.bg, Log: d.log, Hooks: d.hooks, Leases: leaseReissuer{d},
	}, d.templates)
	d.tl = timeline.New(timelineCore{d}, timeline.Config{DataDir: d.cfg.DataDir, Log: d.log, Hooks: d.hooks}, d.templates)
}

// Hooks is the bus on which the state services (task ledger, notes, side
// effects, leases, audit) hear pause, resume, fork and restore
// (internal/statehook): each registers itself in New.
func (d *Daemon) Hooks() *statehook.Bus { return d.hooks }

// Checkpoints is the pause, resume and fork service.
func (d *Daemon) Checkpoints() *checkpoint.Service { return d.ckpt }

// Snapshots is the snapshot and layer-pin service.
func (d *Daemon) Snapshots() *checkpoint.Snapshots { return d.snaps }

// Timeline is the checkpoint-timeline service (checkpoint, rewind, promote).
func (d *Daemon) Timeline() *timeline.Service { return d.tl }

// Close stops background loops. Sandboxes keep running: a daemon restart
// reconciles and adopts them.
func (d *Daemon) Close() {
	// Deletes already answered finish first, at most reclaimDrain; the
	// next start's Reconcile finishes any left.
	if !d.reclaimer.close(reclaimDrain) {
		d.log.Warn("teardowns of deleted sandboxes left for the next start", "bound", reclaimDrain.String())
	}
	d.cancel()
	d.wg.Wait()
	d.net.Release()
	// Outcomes still being committed: written now, not left unknown.
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = d.effects.Flush(fctx)
	cancel()
	d.chans.closeAll()
	d.chans.releaseShared()
	d.self.close()
}

// Activity is the activity timeline service.
func (d *Daemon) Activity() *activity.Service { return d.act }

// Store exposes the store for read-only API handlers (events, templates, keys).
func (d *Daemon) Store() store.Store { return d.store }

// Runtimes lists the configured backends.
func (d *Daemon) Runtimes() map[string]runtime.Runtime { return d.runtimes }

// Config returns the effective configuration.
func (d *Daemon) Config() Config { return d.cfg }

// Lock serialises lifecycle operations on one sandbox.
func (d *Daemon) Lock(id string) func() {
	d.locksMu.Lock()
	m, ok := d.locks[id]
	if !ok {
		m = &sync.Mutex{}
		d.locks[id] = m
	}
	d.locksMu.Unlock()
	m.Lock()
	return m.Unlock
}

func (d *Daemon) SandboxDir(id string) string { return filepath.Join(d.cfg.DataDir, "sandboxes", id) }

func (d *Daemon) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return nil, errs.E(errs.FailedPrecondition, "runtime %q of sandbox %s is not configured on this server", sb.Runtime, sb.ID)
	}
	return rt, nil
}

// Event appends a non-transition event; failures are logged, never fatal.
func (d *Daemon) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	ev := sandbox.Event{SandboxID: sb.ID, Owner: sb.Owner, Time: d.cfg.Now(), Actor: actor, Type: typ,
		Reason: reason, Message: msg, Data: data}
	if _, err := d.store.AppendEvent(context.WithoutCancel(ctx), ev); err != nil {
		d.log.Error("append event", "sandbox_id", sb.ID, "type", typ, "err", err)
	}
}

// Transition moves a sandbox to a new state with an event, in one store transaction.
func (d *Daemon) Transition(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	ev := sandbox.Event{SandboxID: id, Time: d.cfg.Now(), Actor: actor, Type: "transition", Reason: reason, Message: msg}
	return d.store.Transition(context.WithoutCancel(ctx), id, to, ev, func(sb *sandbox.Sandbox) error {
		sb.Reason, sb.Message = reason, msg
		if fn != nil {
			return fn(sb)
		}
		return nil
	})
}

// TransitionLeases is Transition with a change of the sandbox's leases in the same commit.
func (d *Daemon) TransitionLeases(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error) {
	ev := sandbox.Event{SandboxID: id, Time: d.cfg.Now(), Actor: actor, Type: "transition", Reason: reason, Message: msg}
	return d.store.TransitionLeases(context.WithoutCancel(ctx), id, to, ev, func(sb *sandbox.Sandbox) error {
		sb.Reason, sb.Message = reason, msg
		if fn != nil {
			return fn(sb)
		}
		return nil
	}, ch)
}

// Visible loads a sandbox and hides other owners' sandboxes behind NotFound.
// owner "" is the admin view.
func (d *Daemon) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
		}
		return nil, err
	}
	if owner != "" && sb.Owner != owner {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	if sb.State == sandbox.Deleted {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func newToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// GoBackground runs fn on the daemon's lifetime.
func (d *Daemon) GoBackground(name string, fn func(ctx context.Context)) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() {
			if r := recover(); r != nil {
				d.log.Error("background loop panicked", "loop", name, "err", fmt.Sprint(r))
			}
		}()
		fn(d.bg)
	}()
}

// teardownCtx gives cleanup work its own deadline, detached from the caller.
func teardownCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
}

// Log is the daemon's logger, for the services built around the core.
func (d *Daemon) Log() *slog.Logger { return d.log }

// Now is the daemon's clock (Config.Now), injectable in tests.
func (d *Daemon) Now() time.Time { return d.cfg.Now() }
