// Package node is cluster mode's node agent (`berth node`, docs/CLUSTER.md),
// the kubelet's role for sandboxes: beside a full local daemon it keeps the
// host's Node object (address, certificate hash, capacity, what is
// allocated, runtimes, cached templates), renews its Lease, publishes its
// ready templates, and reconciles the Sandbox objects bound to it with the
// sandboxes it runs: it creates what was bound to it and never made here,
// mirrors every local state into the object, and stops and deletes a local
// sandbox whose object is gone or lost (never resurrecting one).
//
// The decisions are one pure function (Decide); this file is the loop
// around it and the Kubernetes writes. Choices worth knowing:
//
//   - Only an object still creating (or pending) is created here, and only
//     CreateGrace after it was bound: the replica forwards its client's
//     create to the node right after writing the object, and that request
//     must win (a duplicate id is AlreadyExists, so a lost race is harmless).
//     An object that says running or paused with no sandbox here is failed
//     with reason missing_on_node, never booted afresh under its id.
//   - Local sandboxes are the cluster's only when bound to this node
//     (Attrs.Cluster.Node, set by daemon.Create for a replica-chosen id or
//     a replica's signed create without one, and on a cluster sandbox's
//     fork children): warm pool members and build sandboxes have no
//     object and are left alone.
//   - A warm hit is forwarded without an id (the node claims a member, its
//     own id) and a fork's children get theirs here: their objects come
//     from the replica after the answer, so such sandboxes carry
//     Attrs.Cluster.AdoptFrom and keep AdoptGrace before a missing object
//     deletes them (reason never_adopted: the replica died in between).
//   - A lost object is final: the agent deletes the local sandbox and never
//     writes the object again (only a delete ends it).
//   - A local delete removes the object; the row removal is remembered
//     (LocalStore) because it follows the deleted state at once.
package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Cluster is the part of the cluster's store (internal/kubestore) the agent
// uses: the Sandbox objects bound to a node, their updates and removal,
// and Template objects.
type Cluster interface {
	SandboxesOnNode(ctx context.Context, node string) ([]*sandbox.Sandbox, error)
	UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	PutTemplate(ctx context.Context, t store.Template) (store.Template, error)
	GetTemplate(ctx context.Context, name string) (store.Template, error)
}

// Config is one agent's wiring.
type Config struct {
	Kube      *kube.Client
	Namespace string
	Name      string // the Node's name
	Daemon    *daemon.Daemon
	// Local is the daemon's store as wrapped before the daemon was built
	// (its writes wake the agent).
	Local   *LocalStore
	Cluster Cluster
	// Address is the peer endpoint (https://host:port), CertSHA256 its
	// certificate's hash (peer.Identity.SHA256).
	Address    string
	CertSHA256 string
	// LeaseDuration is the Lease's duration; it is renewed every quarter of it.
	LeaseDuration time.Duration
	// CreateGrace: Inputs.CreateGrace (default 10s).
	CreateGrace time.Duration
	// AdoptGrace: Inputs.AdoptGrace (default 2m: a replica writes the
	// object right after the node's answer; this covers a slow API server).
	AdoptGrace time.Duration
	// Resync is the reconcile period (default 1s).
	Resync  time.Duration
	Version string
	// PoolSizing sizes the local pools of WarmPool objects (pools.go).
	PoolSizing PoolSizing
	Log        *slog.Logger
	Now        func() time.Time
}

// Agent runs the loops.
type Agent struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	inflight map[string]bool        // ids with a create or delete under way
	tpls     map[string]string      // template name → fingerprint published
	wg       sync.WaitGroup         // creates and deletes under way
	statusMu sync.Mutex             // one Node status write at a time
	pools    poolState              // Run's goroutine only
	fetching map[string]*sync.Mutex // template name → held while its layers are fetched (under mu)
	secrets  secretMirror           // the cluster's secrets mirrored here (secrets.go)
}

// New checks the config.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.Kube == nil || cfg.Daemon == nil || cfg.Local == nil || cfg.Cluster == nil:
		return nil, errs.E(errs.InvalidArgument, "node agent: kube client, daemon, local store and cluster store are required")
	case cfg.Name == "":
		return nil, errs.Field("name", "must be set")
	case cfg.Namespace == "":
		return nil, errs.Field("namespace", "must be set")
	case cfg.LeaseDuration < 4*time.Second:
		return nil, errs.Field("lease_duration", "must be at least 4s, got %s", cfg.LeaseDuration)
	}
	if cfg.CreateGrace == 0 {
		cfg.CreateGrace = 10 * time.Second
	}
	if cfg.AdoptGrace == 0 {
		cfg.AdoptGrace = 2 * time.Minute
	}
	if cfg.Resync == 0 {
		cfg.Resync = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Agent{cfg: cfg, log: cfg.Log.With("node", cfg.Name), inflight: map[string]bool{}, tpls: map[string]string{}, fetching: map[string]*sync.Mutex{},
		pools: poolState{seen: map[string]bool{}, rates: map[string]*placement.Rate{}, managed: map[string]int{}}}, nil
}

// Register writes the Node and its Lease once (so a replica can place on
// this node as soon as `berth node` is up); Run keeps them fresh.
func (a *Agent) Register(ctx context.Context) error {
	if err := a.renewLease(ctx); err != nil {
		return err
	}
	a.publishTemplates(ctx)
	return a.writeStatus(ctx)
}

// Run loops until ctx ends, then waits for the creates and deletes it
// started.
func (a *Agent) Run(ctx context.Context) {
	defer a.wg.Wait()
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.runSecrets(ctx) }()
	renew := time.NewTicker(a.cfg.LeaseDuration / 4)
	defer renew.Stop()
	resync := time.NewTicker(a.cfg.Resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			if err := a.renewLease(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("renew lease", "err", err)
			}
			a.publishTemplates(ctx)
			a.syncPools(ctx)
			if err := a.writeStatus(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("node status", "err", err)
			}
		case <-resync.C:
			a.Reconcile(ctx)
		case <-a.cfg.Local.Changed():
			a.Reconcile(ctx)
		}
	}
}

// Reconcile is one pass: list (local first, then objects: an object is
// always written before its local sandbox, so a local sandbox seen here
// whose object is missing really lost it), decide, apply.
func (a *Agent) Reconcile(ctx context.Context) {
	removed := a.cfg.Local.Removed()
	local, _, err := a.cfg.Daemon.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		a.log.Warn("list local sandboxes", "err", err)
		return
	}
	objs, err := a.cfg.Cluster.SandboxesOnNode(ctx, a.cfg.Name)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("list sandbox objects", "err", err)
		}
		return
	}
	byID := map[string]*sandbox.Sandbox{}
	for _, o := range objs {
		byID[o.ID] = o
	}
	for id := range removed { // removed rows with no object: nothing to mirror
		if byID[id] == nil {
			a.cfg.Local.Forget(id)
		}
	}
	localByID := map[string]*sandbox.Sandbox{}
	for _, sb := range local {
		localByID[sb.ID] = sb
	}
	for _, act := range Decide(Inputs{Now: a.cfg.Now(), Node: a.cfg.Name, Local: local, Objects: objs,
		Removed: removed, CreateGrace: a.cfg.CreateGrace, AdoptGrace: a.cfg.AdoptGrace}) {
		a.apply(ctx, act, localByID[act.ID], byID[act.ID])
	}
}

// errSkip aborts an object update that must not happen (the object is lost).
var errSkip = errors.New("skip")

func (a *Agent) apply(ctx context.Context, act Action, local, obj *sandbox.Sandbox) {
	log := a.log.With("sandbox_id", act.ID, "action", string(act.Kind))
	switch act.Kind {
	case Mirror:
		_, err := a.cfg.Cluster.UpdateSandbox(ctx, act.ID, func(o *sandbox.Sandbox) error {
			if o.State == sandbox.Lost || o.Attrs.Cluster.Node != a.cfg.Name {
				return errSkip // lost is final here; a rebound object is not ours
			}
			mirrorInto(o, local)
			return nil
		})
		if err != nil && !errors.Is(err, errSkip) && !errs.Is(err, errs.NotFound) {
			log.Warn("mirror sandbox state", "err", err)
		}
	case DeleteObject:
		// Marked, not deleted: a node may not delete Sandbox objects
		// (deploy/'s node Role); a replica removes the object and its rows
		// (internal/cluster/api collect.go).
		_, err := a.cfg.Cluster.UpdateSandbox(ctx, act.ID, func(o *sandbox.Sandbox) error {
			if o.State == sandbox.Lost || o.State == sandbox.Deleted || o.Attrs.Cluster.Node != a.cfg.Name {
				return errSkip
			}
			o.State, o.Reason = sandbox.Deleted, act.Reason
			return nil
		})
		if err == nil || errors.Is(err, errSkip) || errs.Is(err, errs.NotFound) {
			a.cfg.Local.Forget(act.ID)
			log.Info("sandbox object marked deleted: deleted on this node")
			return
		}
		log.Warn("mark sandbox object deleted", "err", err)
	case MarkMissing, MarkFailed:
		msg := "this node has no such sandbox (its local state was lost); it is not created again"
		if act.Kind == MarkFailed {
			msg = "it expired before this node created it"
		}
		_, err := a.cfg.Cluster.UpdateSandbox(ctx, act.ID, func(o *sandbox.Sandbox) error {
			if o.State == sandbox.Lost || o.State == sandbox.Failed || o.Attrs.Cluster.Node != a.cfg.Name {
				return errSkip
			}
			o.State, o.Reason, o.Message = sandbox.Failed, act.Reason, msg
			return nil
		})
		if err != nil && !errors.Is(err, errSkip) && !errs.Is(err, errs.NotFound) {
			log.Warn("mark sandbox object failed", "err", err)
			return
		}
		log.Warn("sandbox object marked failed", "reason", act.Reason)
	case Adopt:
		_, err := a.cfg.Daemon.Store().UpdateSandbox(ctx, act.ID, func(sb *sandbox.Sandbox) error {
			if sb.Attrs.Cluster.AdoptFrom.IsZero() {
				return errSkip
			}
			sb.Attrs.Cluster.AdoptFrom = time.Time{}
			return nil
		})
		if err != nil && !errors.Is(err, errSkip) && !errs.Is(err, errs.NotFound) {
			log.Warn("record the adoption of a sandbox", "err", err)
		}
	case Create:
		a.background(act.ID, func(bctx context.Context) { a.create(bctx, obj) })
	case DeleteLocal:
		a.background(act.ID, func(bctx context.Context) { a.deleteLocal(bctx, local, act.Reason) })
	}
}

// background runs a slow step (a create boots a sandbox) off the loop,
// one per sandbox at a time (or per key: "pool-TEMPLATE", which no id is). It lives on the agent's run, not a request.
func (a *Agent) background(id string, fn func(context.Context)) {
	a.mu.Lock()
	if a.inflight[id] {
		a.mu.Unlock()
		return
	}
	a.inflight[id] = true
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() {
			a.mu.Lock()
			delete(a.inflight, id)
			a.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		fn(ctx)
	}()
}

// create makes the object's sandbox here, as its owner, with its id.
func (a *Agent) create(ctx context.Context, obj *sandbox.Sandbox) {
	log := a.log.With("sandbox_id", obj.ID, "owner", obj.Owner, "template", obj.Template)
	ttl := obj.ExpiresAt.Sub(a.cfg.Now())
	if obj.ExpiresAt.IsZero() {
		ttl = 0 // the daemon's default
	}
	attrs := sandbox.Attrs{Cluster: obj.Attrs.Cluster}
	attrs.Cluster.Node = a.cfg.Name
	err := a.ensureTemplate(ctx, obj.Template)
	if err == nil {
		_, err = a.cfg.Daemon.Create(ctx, daemon.CreateRequest{
			ID: obj.ID, Owner: obj.Owner, Actor: "cluster", Template: obj.Template, Runtime: obj.Runtime,
			TTL: ttl, ExpiryAction: obj.ExpiryAction, Resources: obj.Resources, Labels: obj.Labels, Env: obj.Env,
			AutoResume: obj.AutoResume, Attrs: attrs,
		})
	}
	switch {
	case err == nil:
		log.Info("created the sandbox its object bound to this node")
	case errs.Is(err, errs.AlreadyExists):
		// The replica's forwarded create won the race: nothing to do.
	default:
		log.Warn("create bound sandbox", "err", err)
		if _, lerr := a.cfg.Daemon.Store().GetSandbox(ctx, obj.ID); lerr == nil {
			return // it failed after its intent: its failed state is mirrored
		}
		_, uerr := a.cfg.Cluster.UpdateSandbox(ctx, obj.ID, func(o *sandbox.Sandbox) error {
			if o.State != sandbox.Creating && o.State != "pending" {
				return errSkip
			}
			o.State, o.Reason, o.Message = sandbox.Failed, "create_failed", errs.Short(err)
			return nil
		})
		if uerr != nil && !errors.Is(uerr, errSkip) && !errs.Is(uerr, errs.NotFound) {
			log.Warn("mark sandbox object failed", "err", uerr)
		}
	}
	a.cfg.Local.poke()
}

// deleteLocal stops and deletes a sandbox whose object is gone or lost,
// with an event saying why.
func (a *Agent) deleteLocal(ctx context.Context, sb *sandbox.Sandbox, reason string) {
	msg := map[string]string{
		ReasonObjectGone:    "its Sandbox object was deleted",
		ReasonNodeLost:      "its Sandbox object was marked lost (this node's Lease expired); a lost sandbox is never resurrected",
		ReasonObjectDeleted: "its Sandbox object says deleted",
		ReasonNeverAdopted:  "it was made for an API replica's request, and no replica wrote its Sandbox object in time (the replica died before recording it)",
	}[reason]
	a.cfg.Daemon.Event(ctx, sb, "cluster", "cluster_delete", reason, msg, map[string]string{"node": a.cfg.Name})
	a.log.Warn("deleting local sandbox", "sandbox_id", sb.ID, "owner", sb.Owner, "reason", reason, "why", msg)
	if err := a.cfg.Daemon.DeleteAs(ctx, sb.ID, "cluster", reason); err != nil && !errs.Is(err, errs.NotFound) {
		a.log.Error("delete local sandbox", "sandbox_id", sb.ID, "err", err)
	}
}
