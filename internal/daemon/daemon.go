// Package daemon is berth's lifecycle service on one host: it turns API
// requests into store intents, runtime effects and events, and reconciles the
// store against the runtime after a crash.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// Daemon owns every sandbox on this host.
type Daemon struct {
	cfg       Config
	agent     agentInstall
	log       *slog.Logger
	store     store.Store
	runtimes  map[string]runtime.Runtime
	userNS    *rootfs.IDMap // runc sandboxes' id range (userns.go); nil: none
	templates *template.Store
	auth      *auth.Service // API keys and envd tokens

	locksMu sync.Mutex
	locks   map[string]*sync.Mutex

	chanKey []byte // master key of the agent channels (channel.go)
	chansMu sync.Mutex
	chans   map[string]*agentapi.Channel

	pauseMu sync.Mutex
	pauseCh map[string]chan struct{}

	poolSvc *pool.Service     // warm pools (pool.go)
	tplSvc  *template.Service // template import, pull, build, GC (templates.go)

	adm *admission.Service // quota admission, signals, metering, metrics (admission.go)

	net *hostnet.Service // host networking (hostnet.go)

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
	}
	bg, cancel := context.WithCancel(context.Background())
	d := &Daemon{
		cfg: cfg, agent: agent, auth: auth.New(st, cfg.DataDir, cfg.Now, tokenKey), log: cfg.Log, store: st, runtimes: rts, templates: tpl, userNS: userNS,
		locks: map[string]*sync.Mutex{}, chanKey: chanKey, chans: map[string]*agentapi.Channel{},
		pauseCh: map[string]chan struct{}{},
		bg:      bg, cancel: cancel,
	}
	rtNames := make([]string, 0, len(rts))
	for n := range rts {
		rtNames = append(rtNames, n)
	}
	d.poolSvc = pool.New(pool.Config{DefaultRuntime: cfg.DefaultRuntime, Runtimes: rtNames,
		DefaultResources: cfg.DefaultResources, MaxResources: cfg.MaxResources}, d)
	d.tplSvc = template.NewService(template.ServiceConfig{DefaultTemplate: cfg.DefaultTemplate}, tpl, d)
	d.adm = admission.New(d, cfg.admissionConfig())
	d.net = hostnet.New(d, cfg.DataDir, d.auth, d.adm)
	return d, nil
}

// Close stops background loops. Sandboxes keep running: a daemon restart
// reconciles and adopts them.
func (d *Daemon) Close() {
	d.cancel()
	d.wg.Wait()
	d.net.Release()
	d.chansMu.Lock()
	for id, c := range d.chans {
		c.Close()
		delete(d.chans, id)
	}
	d.chansMu.Unlock()
}

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
