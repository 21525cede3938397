package api

import (
	"net/http"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/e2b"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// controlPlaneRoutes is E2B's REST API on a replica: creates and lists
// here, everything about one sandbox on its node. E2B has no admin view:
// even the admin key sees only its own sandboxes (as internal/e2b).
func (r *Replica) controlPlaneRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", r.e2bAuthed(r.e2bCreate(false)))
	mux.HandleFunc("POST /v2/sandboxes", r.e2bAuthed(r.e2bCreate(true)))
	mux.HandleFunc("GET /sandboxes", r.e2bAuthed(r.e2bListV1))
	mux.HandleFunc("GET /v2/sandboxes", r.e2bAuthed(r.e2bList))
	mux.HandleFunc("DELETE /sandboxes/{id}", r.e2bAuthed(r.e2bDelete))
	mux.HandleFunc("/sandboxes/{id}", r.e2bAuthed(r.e2bProxy))
	mux.HandleFunc("/sandboxes/{id}/{rest...}", r.e2bAuthed(r.e2bProxy))
	mux.HandleFunc("/v2/sandboxes/{id}/{rest...}", r.e2bAuthed(r.e2bProxy))
	// Snapshots are in their nodes' stores: listed and deleted by
	// asking every node (e2b_snapshots.go).
	mux.HandleFunc("GET /snapshots", r.e2bAuthed(r.e2bListSnapshots))
	mux.HandleFunc("DELETE /templates/{id}", r.e2bAuthed(r.e2bDeleteTemplate))
	r.e2bBuildRoutes(mux)
	mux.HandleFunc("/", r.e2bAuthed(func(w http.ResponseWriter, req *http.Request, _ auth.Principal) {
		// What else E2B has berth does not serve on one host either.
		writeE2BError(w, errs.E(errs.NotImplemented, "%s %s is not served by a cluster API replica (berth serve --cluster)", req.Method, req.URL.Path))
	}))
	return mux
}

type e2bHandler func(w http.ResponseWriter, r *http.Request, p auth.Principal)

// e2bAuthed resolves X-API-KEY.
func (r *Replica) e2bAuthed(h e2bHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		key := req.Header.Get("X-API-KEY")
		if key == "" {
			httpx.WriteJSON(w, http.StatusUnauthorized, e2b.StatusBody(http.StatusUnauthorized, "missing X-API-KEY header"))
			return
		}
		p, err := r.authenticate(req, key)
		if err != nil {
			writeE2BError(w, err)
			return
		}
		h(w, req, p)
	}
}

func (r *Replica) e2bCreate(v2 bool) e2bHandler {
	return func(w http.ResponseWriter, req *http.Request, p auth.Principal) {
		body, err := readBody(req, maxCreateBody)
		if err != nil {
			writeE2BError(w, err)
			return
		}
		spec, err := e2bSpec(body, p.Owner, r.cfg.DefaultTemplate, v2)
		if err != nil {
			writeE2BError(w, err)
			return
		}
		ans, err := r.create(req.Context(), req, body, spec, peer.Principal{Owner: p.Owner})
		if err != nil {
			if errs.FieldOf(err) == "template" {
				err = errs.Reclassify(errs.InvalidArgument, err, "templateID: unknown template %q", spec.Template)
			}
			writeE2BError(w, err)
			return
		}
		ans.write(w)
	}
}

// e2bPage lists one page from the objects, in E2B's ListedSandbox form.
func (r *Replica) e2bPage(req *http.Request, p auth.Principal, f store.SandboxFilter) ([]any, string, error) {
	list, next, err := r.cfg.Store.ListSandboxes(req.Context(), f)
	if err != nil {
		return nil, "", err
	}
	out := make([]any, 0, len(list))
	for _, sb := range list {
		if isPoolMember(sb) {
			continue
		}
		if v, ok := e2b.Listed(sb, r.cfg.DefaultTemplate); ok {
			out = append(out, v)
		}
	}
	return out, next, nil
}

func (r *Replica) e2bFilter(req *http.Request, p auth.Principal, q map[string][]string) (store.SandboxFilter, error) {
	lf, err := e2b.ListFilter(p.Owner, r.cfg.DefaultTemplate, q)
	if err != nil {
		return store.SandboxFilter{}, err
	}
	return store.SandboxFilter{Owner: lf.Owner, States: lf.States, Labels: lf.Labels, Template: lf.Template,
		CreatedAfter: lf.CreatedAfter, Order: lf.Order, Limit: lf.Limit, After: lf.Cursor}, nil
}

// e2bList is GET /v2/sandboxes: one page, X-Next-Token when there is more.
func (r *Replica) e2bList(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	f, err := r.e2bFilter(req, p, req.URL.Query())
	if err != nil {
		writeE2BError(w, err)
		return
	}
	out, next, err := r.e2bPage(req, p, f)
	if err != nil {
		writeE2BError(w, err)
		return
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

// e2bListV1 is the 1.x GET /sandboxes: every running sandbox, no paging.
func (r *Replica) e2bListV1(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	q := req.URL.Query()
	q.Set("state", "running")
	q.Del("nextToken")
	f, err := r.e2bFilter(req, p, q)
	if err != nil {
		writeE2BError(w, err)
		return
	}
	all := []any{}
	for {
		page, next, err := r.e2bPage(req, p, f)
		if err != nil {
			writeE2BError(w, err)
			return
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		f.After = next
	}
	httpx.WriteJSON(w, http.StatusOK, all)
}

// e2bProxy sends /sandboxes/{id}/... (detail, timeout, pause, connect,
// metrics, snapshots, fork) to the sandbox's node.
func (r *Replica) e2bProxy(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	sb, err := r.visible(req, p.Owner, req.PathValue("id"))
	if err != nil {
		writeE2BError(w, err)
		return
	}
	var after func(*http.Response) error
	if isFork(req.Method, req.PathValue("rest")) {
		after = func(resp *http.Response) error { return r.recordE2B(req.Context(), sb, resp) }
	}
	r.proxy(w, req, sb, &peer.Principal{Owner: p.Owner}, styleE2B, after)
}

// e2bDelete is E2B's kill: through the node, then the object.
func (r *Replica) e2bDelete(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	sb, err := r.visible(req, p.Owner, req.PathValue("id"))
	if err != nil {
		writeE2BError(w, err)
		return
	}
	if sb.State == sandbox.Lost || sb.Attrs.Cluster.Node == "" {
		if err := r.forget(req.Context(), sb); err != nil {
			writeE2BError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	r.proxy(w, req, sb, &peer.Principal{Owner: p.Owner}, styleE2B, func(resp *http.Response) error {
		return r.afterDelete(req.Context(), sb, resp)
	})
}

// serveEnvd sends envd (and other sandbox port) traffic to the sandbox's
// node unsigned: the node checks the sandbox's access token itself. A
// request that names no sandbox is found by its access token's hash.
func (r *Replica) serveEnvd(w http.ResponseWriter, req *http.Request, t e2b.Target) {
	ctx := req.Context()
	var sbID = t.SandboxID
	if sbID == "" {
		tok := req.Header.Get("X-Access-Token")
		if tok == "" {
			// A signed file URL built on E2B_SANDBOX_URL: only the
			// signature names the sandbox, and checking it needs every
			// sandbox's token, which lives on the nodes.
			writeE2BError(w, errs.Field("E2b-Sandbox-Id", "cluster mode routes envd requests by the E2b-Sandbox-Id header, the host name or X-Access-Token; this request has none"))
			return
		}
		sb, err := r.cfg.Store.SandboxByTokenHash(ctx, auth.TokenHash(tok))
		if err != nil {
			if errs.Is(err, errs.NotFound) {
				err = errs.E(errs.Unauthenticated, "invalid access token")
			}
			writeE2BError(w, err)
			return
		}
		sbID = sb.ID
	}
	sb, err := r.cfg.Store.GetSandbox(ctx, sbID)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			err = errs.E(errs.NotFound, "sandbox %q not found", sbID)
		}
		writeE2BError(w, err)
		return
	}
	r.proxy(w, req, sb, nil, styleE2B, nil)
}
