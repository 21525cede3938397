package api

import (
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

type handler func(w http.ResponseWriter, r *http.Request, p auth.Principal) error

// restRoutes is /v1 as a replica serves it. What is in the nodes'
// journals (usage, reports, builds, snapshots, the audit) is asked of
// every node and merged, or sent to the node that holds it; what is store
// state (quotas, keys, templates' objects) is served here. What is left
// (the console) answers 501 naming cluster mode.
func (r *Replica) restRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(api.OpenAPI)
	})
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, wire.Health{OK: true})
	})
	r.handle(mux, "GET /v1/info", r.info)
	r.handle(mux, "POST /v1/sandboxes", r.createREST)
	r.handle(mux, "GET /v1/sandboxes", r.listREST)
	r.handle(mux, "GET /v1/sandboxes/{id}", r.getREST)
	r.handle(mux, "DELETE /v1/sandboxes/{id}", r.deleteREST)
	r.handle(mux, "/v1/sandboxes/{id}/{rest...}", r.proxyREST)
	// The port proxy authenticates itself on the node (a port token, or
	// the sandbox being public): forwarded without a principal unless
	// the caller sent an API key.
	mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", r.portProxy)
	r.handle(mux, "GET /v1/templates", r.listTemplates)
	r.handle(mux, "GET /v1/templates/{name}", r.getTemplate)
	r.handle(mux, "POST /v1/keys", r.createKey)
	// Metering lives in each node's journal: asked of every node, merged
	// (fanout.go).
	r.handle(mux, "GET /v1/usage", r.usage)
	r.handle(mux, "GET /v1/reports/orphans", r.orphans)
	r.handle(mux, "GET /v1/usage/series", r.usageSeries)
	r.handle(mux, "POST /v1/reports/orphans/cleanup", r.cleanupOrphans)
	r.handle(mux, "GET /v1/events", r.allEvents)
	r.quotaRoutes(mux)
	r.templateRoutes(mux)
	r.snapshotRoutes(mux)
	r.auditRoutes(mux)
	// Secrets are store state, sealed under the cluster data key; nodes
	// mirror them (secrets.go).
	r.secretRoutes(mux)
	// Issue 16: the rest of one host's surface (pools.go, leases.go,
	// metrics.go).
	r.poolRoutes(mux)
	r.leaseRoutes(mux)
	r.handle(mux, "GET /metrics", r.serveMetrics)
	notServed := func(w http.ResponseWriter, req *http.Request) {
		writeError(w, errs.E(errs.NotImplemented, "%s %s is not served by a cluster API replica (berth serve --cluster): run it against a node's own API, or on one host", req.Method, req.URL.Path))
	}
	for _, p := range []string{"/v1/", "/ui", "/ui/"} {
		mux.HandleFunc(p, notServed)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, errs.E(errs.NotFound, "no route for %s %s", req.Method, req.URL.Path))
	})
	return mux
}

func (r *Replica) handle(mux *http.ServeMux, pattern string, h handler) {
	mux.HandleFunc(pattern, func(w http.ResponseWriter, req *http.Request) {
		p, err := r.authenticate(req, auth.KeyFromRequest(req))
		if err == nil {
			err = h(w, req, p)
		}
		if err != nil {
			if errs.KindOf(err) == errs.Internal {
				r.log.ErrorContext(req.Context(), "request failed", "method", req.Method, "path", req.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

// authenticate maps an API key to its principal. Keys live in the store,
// so a key minted through any replica (or a node's admin key file's
// replica) works on every replica.
func (r *Replica) authenticate(req *http.Request, key string) (auth.Principal, error) {
	p, err := r.cfg.Auth.Authenticate(req.Context(), key)
	if err != nil {
		return auth.Principal{}, err
	}
	if p.Sandbox != "" {
		return auth.Principal{}, errs.E(errs.Internal, "a key authenticated as a sandbox")
	}
	return p, nil
}

// scope is the owner a request acts for: its key's owner, or for the
// admin key an explicit ?owner= (empty = every owner), as on one host.
func scope(r *http.Request, p auth.Principal) string {
	if p.Admin {
		return r.URL.Query().Get("owner")
	}
	return p.Owner
}

// visible reads sandbox id as owner may see it: another owner's sandbox
// and a deleted one are NotFound, as on one host.
func (r *Replica) visible(req *http.Request, owner, id string) (*sandbox.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	sb, err := r.cfg.Store.GetSandbox(req.Context(), id)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
		}
		return nil, err
	}
	if (owner != "" && sb.Owner != owner) || sb.State == sandbox.Deleted {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

// sandboxView is the REST form of a sandbox object; Extra carries where it
// runs ("node") and, once lost, when ("lost_at").
func sandboxView(sb *sandbox.Sandbox) wire.Sandbox {
	extra := sb.LegacyExtra()
	if n := sb.Attrs.Cluster.Node; n != "" {
		if extra == nil {
			extra = map[string]string{}
		}
		extra["node"] = n
		if t := sb.Attrs.Cluster.LostAt; !t.IsZero() {
			extra["lost_at"] = t.UTC().Format("2006-01-02T15:04:05.999999999Z07:00")
		}
	}
	return wire.Sandbox{
		ID: sb.ID, Owner: sb.Owner, Template: sb.Template, TemplateID: sb.TemplateID, Runtime: sb.Runtime,
		State: wire.State(sb.State), Reason: sb.Reason, Message: sb.Message, Labels: sb.Labels, Env: sb.Env,
		Resources: wire.Resources(sb.Resources), CreatedAt: sb.CreatedAt, StartedAt: sb.StartedAt,
		ExpiresAt: sb.ExpiresAt, ExpiryAction: wire.ExpiryAction(sb.ExpiryAction),
		PauseRequested: wire.PauseMode(sb.PauseRequested), PauseActual: wire.PauseMode(sb.PauseActual),
		ResumedFrom: wire.PauseMode(sb.ResumedFrom), RestoreCount: sb.RestoreCount, AutoResume: sb.AutoResume,
		Extra: extra,
	}
}

// isPoolMember: a node's unclaimed warm members are nobody's sandboxes.
func isPoolMember(sb *sandbox.Sandbox) bool { return pool.IsMember(sb) }

// listFilter reads GET /v1/sandboxes's query, as on one host.
func listFilter(r *http.Request, p auth.Principal) (store.SandboxFilter, error) {
	q := r.URL.Query()
	f := store.SandboxFilter{Owner: scope(r, p), Template: q.Get("template"), Order: q.Get("order"), After: q.Get("cursor")}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			if one == "" {
				continue
			}
			if !sandbox.ValidState(one) {
				return f, errs.Field("state", "unknown state %q", one)
			}
			f.States = append(f.States, sandbox.State(one))
		}
	}
	if len(f.States) == 0 {
		for _, s := range sandbox.States() {
			if s != sandbox.Deleted {
				f.States = append(f.States, s)
			}
		}
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return f, errs.Field("label", "must be key=value, got %q", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if f.Order != "" && f.Order != store.OrderAsc && f.Order != store.OrderDesc {
		return f, errs.Field("order", "must be asc or desc, got %q", f.Order)
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return f, errs.Field("limit", "must be a non-negative integer")
		}
		f.Limit = n
	}
	return f, nil
}

func (r *Replica) listREST(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	f, err := listFilter(req, p)
	if err != nil {
		return err
	}
	list, next, err := r.cfg.Store.ListSandboxes(req.Context(), f)
	if err != nil {
		return err
	}
	out := make([]wire.Sandbox, 0, len(list))
	for _, sb := range list {
		if !isPoolMember(sb) {
			out = append(out, sandboxView(sb))
		}
	}
	writeJSON(w, http.StatusOK, wire.ListResponse{Sandboxes: out, Next: next})
	return nil
}

func (r *Replica) getREST(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	sb, err := r.visible(req, scope(req, p), req.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxView(sb))
	return nil
}

func (r *Replica) listTemplates(w http.ResponseWriter, req *http.Request, _ auth.Principal) error {
	list, err := r.cfg.Store.ListTemplates(req.Context())
	if err != nil {
		return err
	}
	out := make([]wire.Template, 0, len(list))
	for _, t := range list {
		out = append(out, templateView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (r *Replica) getTemplate(w http.ResponseWriter, req *http.Request, _ auth.Principal) error {
	t, err := r.cfg.Store.GetTemplate(req.Context(), req.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, templateView(t))
	return nil
}

func templateView(t store.Template) wire.Template {
	layers := t.Layers
	if layers == nil {
		layers = []string{}
	}
	return wire.Template{Name: t.Name, Fingerprint: t.Fingerprint, Layers: layers, State: t.State, Progress: t.Progress,
		Error: t.Error, Source: t.Source, StartCmd: t.StartCmd, Env: t.Env, Workdir: t.Workdir, User: t.User,
		Resources: wire.Resources(t.Resources), CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

// createKey mints a tenant key (admin only), into the store every
// replica reads.
func (r *Replica) createKey(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may create API keys")
	}
	var body wire.KeyRequest
	if err := httpx.Decode(req, &body); err != nil {
		return err
	}
	key, err := r.cfg.Auth.CreateKey(req.Context(), body.Owner, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, wire.KeyResponse{Owner: body.Owner, Key: key})
	return nil
}

// info is GET /v1/info on a replica: who the key is, and the fleet's
// runtimes and CPUs as its nodes report them (the replica has neither).
func (r *Replica) info(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(req.Context(), berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return err
	}
	out := wire.Info{Version: r.cfg.Version, Owner: p.Owner, Admin: p.Admin, Runtimes: []wire.RuntimeInfo{}}
	out.Hostname, _ = os.Hostname()
	seen := map[string]bool{}
	for _, n := range nl.Items {
		out.CPUs += int(n.Status.Capacity.CPUMillis / 1000)
		for _, rt := range n.Status.Runtimes {
			if !seen[rt.Name] {
				seen[rt.Name] = true
				out.Runtimes = append(out.Runtimes, wire.RuntimeInfo{Name: rt.Name, Checkpoint: slices.Contains(rt.Capabilities, "memory-checkpoint")})
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
