// Package api is cluster mode's API replica, `berth serve --cluster`
// (docs/CLUSTER.md): a stateless HTTP front over the Kubernetes store. It
// authenticates API keys from the store, places each new sandbox on a node
// (internal/placement over the Node objects and the Sandbox objects bound
// to them), writes the bound Sandbox object and forwards the create to
// that node; it answers lists and gets from the objects, and sends every
// other sandbox-scoped request (REST, the E2B control plane, envd traffic)
// to the node that runs the sandbox, streams and upgrades included. It
// also runs the node-loss detector (nodeloss.go).
//
// Nothing is kept between requests but caches: several replicas behind
// one Service answer alike, and any of them may die.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/e2b"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Store is what the replica reads and writes of the Kubernetes store
// (kubestore.Store): the sandbox objects and the templates. API keys are
// read through Config.Auth.
type Store interface {
	CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error
	GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	SandboxByTokenHash(ctx context.Context, hash string) (*sandbox.Sandbox, error)
	ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*sandbox.Sandbox, string, error)
	UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	GetTemplate(ctx context.Context, name string) (store.Template, error)
	ListTemplates(ctx context.Context) ([]store.Template, error)
	ListEvents(ctx context.Context, f store.EventFilter) ([]sandbox.Event, error)
}

// nodeLister is kubestore's SandboxesOnNode: the sandboxes bound to a
// node, by label. A store without it is listed whole and filtered.
type nodeLister interface {
	SandboxesOnNode(ctx context.Context, node string) ([]*sandbox.Sandbox, error)
}

// sandboxesOnNode lists the sandboxes bound to node.
func (r *Replica) sandboxesOnNode(ctx context.Context, node string) ([]*sandbox.Sandbox, error) {
	if nl, ok := r.cfg.Store.(nodeLister); ok {
		return nl.SandboxesOnNode(ctx, node)
	}
	var out []*sandbox.Sandbox
	f := store.SandboxFilter{Limit: 500}
	for {
		page, next, err := r.cfg.Store.ListSandboxes(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, sb := range page {
			if sb.Attrs.Cluster.Node == node {
				out = append(out, sb)
			}
		}
		if next == "" {
			return out, nil
		}
		f.After = next
	}
}

// Config configures a replica.
type Config struct {
	Kube      *kube.Client
	Namespace string
	// Store is the Kubernetes store (kubestore.Open).
	Store Store
	// Token is the cluster token (peer.EnsureToken): it signs what the
	// replica forwards to nodes.
	Token string
	// Auth authenticates API keys against Store (auth.New on it).
	Auth *auth.Service
	Log  *slog.Logger
	// Domain is the sandbox domain: "<port>-<id>.<Domain>" hosts are
	// routed to that sandbox (as internal/e2b does on one host).
	Domain string
	// DefaultTemplate is the template of a create that names none, and
	// E2B's "base". Default "default".
	DefaultTemplate string
	// DefaultTTL is the expiry written on a new object before its node
	// answers (the node's own figure replaces it). Default 15m.
	DefaultTTL time.Duration
	// LossInterval is the node-loss detector's period. Default 1s.
	LossInterval time.Duration
	// ScheduleInterval is the scheduler's period (scheduler.go); a
	// queued create or a delete also wakes it. Default 1s.
	ScheduleInterval time.Duration
	// QueueWait is how long a create that fits on no node waits in the
	// queue for the scheduler to bind it (0: refused at once, 429).
	QueueWait time.Duration
	// FanOutTimeout is how long each node may take to answer a request
	// asked of every node (usage, reports). Default 5s.
	FanOutTimeout time.Duration
	// Version is what GET /v1/info reports.
	Version string
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Replica is one API replica.
type Replica struct {
	cfg   Config
	log   *slog.Logger
	nodes *nodeClients
	rest  *http.ServeMux
	cp    *http.ServeMux

	mu      sync.Mutex // guards learner
	learner *placement.Learner
	secrets secretKeys // the cluster data key (secrets.go)

	wake chan struct{} // kicks the scheduler (buffered 1)

	metrics *replicaMetrics // GET /metrics (metrics.go)
}

// New builds a replica.
func New(cfg Config) (*Replica, error) {
	if cfg.Kube == nil || cfg.Store == nil || cfg.Auth == nil {
		return nil, errs.E(errs.InvalidArgument, "cluster api: Kube, Store and Auth are required")
	}
	if cfg.Namespace == "" {
		return nil, errs.Field("namespace", "must be set")
	}
	if len(cfg.Token) < 32 {
		return nil, errs.Field("token", "the cluster token must be at least 32 characters")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "default"
	}
	if cfg.DefaultTTL <= 0 {
		cfg.DefaultTTL = 15 * time.Minute
	}
	if cfg.LossInterval <= 0 {
		cfg.LossInterval = time.Second
	}
	if cfg.ScheduleInterval <= 0 {
		cfg.ScheduleInterval = time.Second
	}
	if cfg.QueueWait < 0 {
		return nil, errs.Field("queue_wait", "must not be negative, got %s", cfg.QueueWait)
	}
	if cfg.FanOutTimeout <= 0 {
		cfg.FanOutTimeout = fanOutTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Replica{cfg: cfg, log: cfg.Log.With("component", "cluster-api"), learner: placement.NewLearner(),
		wake: make(chan struct{}, 1), metrics: newReplicaMetrics()}
	r.nodes = newNodeClients(cfg.Kube, cfg.Namespace)
	r.rest = r.restRoutes()
	r.cp = r.controlPlaneRoutes()
	return r, nil
}

// Handler is the replica's whole HTTP surface on one listener, routed as
// `berth serve` routes it: E2B envd traffic and control-plane paths by
// internal/e2b's rules, everything else berth's /v1.
func (r *Replica) Handler() http.Handler {
	return r.countRequests(func(w http.ResponseWriter, req *http.Request) string {
		// A client never speaks for the replica: the channel's headers go
		// before anything reads the request.
		peer.Strip(req.Header)
		t, err := e2b.Route(req, r.cfg.Domain)
		if err != nil {
			writeE2BError(w, err)
			return "unrouted"
		}
		switch t.Kind {
		case e2b.TargetEnvd, e2b.TargetPort:
			r.serveEnvd(w, req, t)
			return "envd"
		case e2b.TargetControlPlane:
			r.cp.ServeHTTP(w, req)
			return "e2b " + req.Pattern
		default:
			r.rest.ServeHTTP(w, req)
			return req.Pattern
		}
	})
}

// now is the replica's clock.
func (r *Replica) now() time.Time { return r.cfg.Now() }

func writeError(w http.ResponseWriter, err error) { httpx.WriteError(w, err) }

func writeJSON(w http.ResponseWriter, status int, v any) { httpx.WriteJSONIndent(w, status, v) }

// writeE2BError answers err in the E2B control plane's form.
func writeE2BError(w http.ResponseWriter, err error) {
	st := httpx.Status(httpx.KindOf(err))
	httpx.WriteJSON(w, st, e2b.StatusBody(st, err.Error()))
}
