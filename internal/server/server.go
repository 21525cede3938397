// Package server serves berth's REST API under /v1. Handlers are thin: they
// authenticate, decode, call the daemon and encode; error kinds become HTTP
// statuses in exactly one place (internal/httpx's Status).
package server

import (
	"log/slog"
	"net/http"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/console"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/trace"
)

// The handler groups, one per domain of the API, so no type holds every
// handler: sandboxes (lifecycle, exec, files), networking (policy, ports,
// secrets), images (templates, builds, pools, snapshots, forks) and
// administration (keys, events, usage, quotas, metrics).
type (
	sandboxAPI struct{ *Server }
	netAPI     struct{ *Server }
	imageAPI   struct{ *Server }
	adminAPI   struct{ *Server }
)

// Server is the /v1 HTTP surface.
type Server struct {
	d   *daemon.Daemon
	log *slog.Logger
	mux *http.ServeMux
}

// New builds the /v1 handler.
func New(d *daemon.Daemon, log *slog.Logger) *Server {
	s := &Server{d: d, log: log, mux: http.NewServeMux()}
	s.routes()
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type handler func(w http.ResponseWriter, r *http.Request, p daemon.Principal) error

func (s *Server) routes() {
	// Handlers are grouped by domain, each group a view of the server.
	sb, nw, img, adm := sandboxAPI{s}, netAPI{s}, imageAPI{s}, adminAPI{s}
	s.mux.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(api.OpenAPI)
	})
	s.mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, wire.Health{OK: true})
	})
	s.handle("GET /v1/info", adm.info)

	s.handle("POST /v1/sandboxes", sb.createSandbox)
	s.handle("GET /v1/sandboxes", sb.listSandboxes)
	s.handle("GET /v1/sandboxes/{id}", sb.getSandbox)
	s.handle("DELETE /v1/sandboxes/{id}", sb.deleteSandbox)
	s.handle("POST /v1/sandboxes/{id}/stop", sb.stopSandbox)
	s.handle("POST /v1/sandboxes/{id}/start", sb.startSandbox)
	s.handle("POST /v1/sandboxes/{id}/extend", sb.extendSandbox)
	s.handle("POST /v1/sandboxes/{id}/pause", sb.pauseSandbox)
	s.handle("POST /v1/sandboxes/{id}/resume", sb.resumeSandbox)
	s.handle("POST /v1/sandboxes/{id}/lease", sb.leaseSandbox)
	s.handle("GET /v1/sandboxes/{id}/events", adm.sandboxEvents)
	s.handle("GET /v1/sandboxes/{id}/activity", activityAPI{s}.sandboxActivity)
	s.handle("GET /v1/sandboxes/{id}/net", nw.getNetwork)
	s.handle("PUT /v1/sandboxes/{id}/net", nw.setNetwork)
	s.handle("GET /v1/sandboxes/{id}/net/log", nw.egressLog)
	s.handle("POST /v1/sandboxes/{id}/ports", nw.exposePort)
	s.handle("GET /v1/sandboxes/{id}/ports", nw.listPorts)
	s.handle("DELETE /v1/sandboxes/{id}/ports/{port}", nw.closePort)
	s.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", nw.portProxy) // any method; authenticates itself
	s.handle("GET /v1/secrets", nw.listSecrets)
	s.handle("PUT /v1/secrets/{name}", nw.putSecret)
	s.handle("DELETE /v1/secrets/{name}", nw.deleteSecret)
	la := leasesAPI{s} // credential leases (leases.go)
	s.handle("GET /v1/sandboxes/{id}/leases", la.sandboxLeases)
	s.handle("GET /v1/leases", la.listLeases)
	s.handle("DELETE /v1/leases/{id}", la.revokeLease)
	s.handle("POST /v1/sandboxes/{id}/snapshot", img.snapshotSandbox)
	s.handle("POST /v1/sandboxes/{id}/fork", img.forkSandbox)
	s.handle("GET /v1/snapshots", img.listSnapshots)
	s.handle("GET /v1/snapshots/{id}", img.getSnapshot)
	s.handle("DELETE /v1/snapshots/{id}", img.deleteSnapshot)
	s.handle("POST /v1/snapshots/{id}/template", img.promoteSnapshot)
	au := auditAPI{s} // the audit chain (audit.go)
	s.handle("GET /v1/audit", au.listAudit)
	s.handle("POST /v1/audit/verify", au.verifyAudit)
	tl := timelineAPI{s} // checkpoints, rewind, promote (timeline.go)
	s.handle("POST /v1/sandboxes/{id}/checkpoints", tl.createCheckpoint)
	s.handle("GET /v1/sandboxes/{id}/checkpoints", tl.listCheckpoints)
	s.handle("GET /v1/sandboxes/{id}/checkpoints/{ref}", tl.getCheckpoint)
	s.handle("DELETE /v1/sandboxes/{id}/checkpoints/{ref}", tl.deleteCheckpoint)
	s.handle("POST /v1/sandboxes/{id}/rewind", tl.rewind)
	s.handle("POST /v1/sandboxes/{id}/promote", tl.promote)
	s.handle("GET /v1/sandboxes/{id}/effects", effectsAPI{s}.listEffects) // side-effect ledger (effects.go)
	s.handle("GET /v1/sandboxes/{id}/diff", lineageAPI{s}.diff)
	s.handle("POST /v1/sandboxes/{id}/compare", lineageAPI{s}.compare)
	nt := notesAPI{s} // handoff notes (notes.go); also on selfRoutes
	s.handle("GET /v1/sandboxes/{id}/note", nt.current)
	s.handle("POST /v1/sandboxes/{id}/note", nt.write)
	s.handle("GET /v1/sandboxes/{id}/notes", nt.list)
	s.handle("GET /v1/sandboxes/{id}/notes/{seq}", nt.get)
	s.handle("GET /v1/pools", img.listPools)
	s.handle("PUT /v1/pools/{template}", img.setPool)
	s.handle("DELETE /v1/pools/{template}", img.deletePool)

	s.handle("POST /v1/sandboxes/{id}/exec", sb.exec)
	s.handle("GET /v1/sandboxes/{id}/processes", sb.listProcesses)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/attach", sb.attach)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/stdin", sb.stdin)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/close-stdin", sb.closeStdin)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", sb.signal)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/resize", sb.resize)

	s.handle("GET /v1/sandboxes/{id}/files", sb.readFile)
	s.handle("PUT /v1/sandboxes/{id}/files", sb.writeFile)
	s.handle("POST /v1/sandboxes/{id}/files:batch", sb.writeBatch)
	s.handle("GET /v1/sandboxes/{id}/files:batch", sb.readBatch)
	s.handle("POST /v1/sandboxes/{id}/fs/{op}", sb.fsOp)

	s.handle("GET /v1/events", adm.allEvents)
	s.handle("GET /v1/templates", img.listTemplates)
	s.handle("GET /v1/templates/{name}", img.getTemplate)
	s.handle("PUT /v1/templates/{name}/tar", img.importTemplate)
	s.handle("POST /v1/templates/{name}/pull", img.pullTemplate)
	s.handle("POST /v1/templates/{name}/build", img.buildTemplate)
	s.handle("DELETE /v1/templates/{name}", img.deleteTemplate)
	s.handle("POST /v1/keys", adm.createKey)

	s.handle("GET /v1/usage", adm.usage)
	s.handle("GET /v1/reports/orphans", adm.orphans)
	s.handle("GET /v1/quotas", adm.listQuotas)
	s.handle("GET /v1/quotas/{owner}", adm.getQuota)
	s.handle("PUT /v1/quotas/{owner}", adm.putQuota)
	s.handle("DELETE /v1/quotas/{owner}", adm.deleteQuota)
	s.handle("GET /metrics", adm.metrics)

	// Console operator views (issue 19): cost over time, orphan clean-up, build history.
	s.handle("GET /v1/usage/series", adm.usageSeries)
	s.handle("POST /v1/reports/orphans/cleanup", adm.cleanupOrphans)
	s.handle("GET /v1/builds", img.templateBuilds)

	// The web console (internal/console): its assets and sign-in at /ui; it
	// calls the routes above with its session cookie (see authenticate).
	ui := s.d.Console().Handler()
	s.mux.Handle(console.Prefix+"/", ui)
	s.mux.Handle(console.Prefix, ui)
	mg := mergeAPI{s} // merges of forks and their conflicts (merges.go)
	s.handle("POST /v1/sandboxes/{id}/merges", mg.startMerge)
	s.handle("GET /v1/sandboxes/{id}/merges", mg.listMerges)
	s.handle("GET /v1/sandboxes/{id}/merges/{mid}", mg.getMerge)
	s.handle("POST /v1/sandboxes/{id}/merges/{mid}/abort", mg.abortMerge)
	s.handle("POST /v1/sandboxes/{id}/merges/{mid}/continue", mg.continueMerge)
	s.handle("GET /v1/sandboxes/{id}/conflicts", mg.listConflicts)
	s.handle("POST /v1/sandboxes/{id}/conflicts/{cid}/resolve", mg.resolveConflict)

	tk := taskAPI{s} // the task ledger (tasks.go); reachable from inside the sandbox
	s.handle("GET /v1/sandboxes/{id}/tasks", tk.list)
	s.handle("POST /v1/sandboxes/{id}/tasks", tk.create)
	s.handle("GET /v1/sandboxes/{id}/tasks/{task}", tk.get)
	s.handle("GET /v1/sandboxes/{id}/tasks/{task}/history", tk.history)
	s.handle("POST /v1/sandboxes/{id}/tasks/{task}/steps", tk.addStep)
	s.handle("POST /v1/sandboxes/{id}/tasks/{task}/steps/{step}/{op}", tk.step)
	s.handle("POST /v1/sandboxes/{id}/tasks/{task}/gates", tk.ask)
	s.handle("POST /v1/sandboxes/{id}/tasks/{task}/gates/{gate}/{decision}", tk.decide)

	s.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.E(errs.NotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
}

// handle registers an authenticated route.
func (s *Server) handle(pattern string, h handler) {
	client := clientRoute(pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		trace.Route(r.Context(), pattern) // the request's span is named after its route
		p, err := s.authenticate(r)
		if err == nil {
			// A sandbox principal: selfRoutes, its own id (self.go). A refusal
			// is an audit entry too (actor sandbox:<id>).
			if serr := checkSelf(pattern, r.PathValue("id"), p); serr != nil {
				err = s.audited(pattern, func(http.ResponseWriter, *http.Request, daemon.Principal) error { return serr }, w, r, p)
				p = daemon.Principal{}
			}
		}
		if err == nil {
			if client {
				// A client of the sandbox until the request ends (exec/attach
				// streams, file transfers): the reaper leaves it be.
				// Only once the caller may see it: another tenant's
				// refused requests must not keep it awake.
				defer s.d.Admission().OpenClientStream(r.Context(), owner(r, p), r.PathValue("id"))()
			}
			err = s.audited(pattern, h, w, r, p) // one `api` entry in the audit chain (audit.go)
		}
		if err != nil {
			if errs.KindOf(err) == errs.Internal {
				s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

// authenticate maps a request to its caller: by its API key, or, with no
// key, by the console's session cookie, which acts with its key's rights
// and, for a write, only with the session's CSRF header from the console's
// own origin (console.Check).
func (s *Server) authenticate(r *http.Request) (daemon.Principal, error) {
	if p, ok := selfPrincipal(r); ok { // from inside a sandbox (ServeSelf, self.go)
		return p, nil
	}
	// An API replica's signed request acts as the principal it names;
	// cluster headers that do not verify are refused (auth/cluster.go).
	if p, ok, err := s.d.Auth().ClusterPrincipal(r); err != nil || ok {
		return p, err
	}
	key := auth.KeyFromRequest(r)
	if key == "" {
		k, err := s.d.Console().Authorize(r)
		if err != nil {
			return daemon.Principal{}, err
		}
		key = k
	}
	p, err := s.d.Auth().Authenticate(r.Context(), key)
	if err == nil && p.Sandbox != "" { // only the in-sandbox API makes a sandbox principal
		return daemon.Principal{}, errs.E(errs.Internal, "a key authenticated as a sandbox")
	}
	return p, err
}

// owner is the owner a request acts for: its key's owner, or for the admin
// key an explicit ?owner= (empty = every owner, for reads).
func owner(r *http.Request, p daemon.Principal) string {
	if p.Admin {
		return r.URL.Query().Get("owner")
	}
	return p.Owner
}

// Error is the body of every non-2xx response.
type Error = wire.Error

// httpStatus is REST's error kind → HTTP status (httpx's table, shared with
// the agent socket and the E2B control plane).
func httpStatus(k errs.Kind) int { return httpx.Status(k) }

func writeError(w http.ResponseWriter, err error) { httpx.WriteError(w, err) }

func writeJSON(w http.ResponseWriter, status int, v any) { httpx.WriteJSONIndent(w, status, v) }

// decode reads a strict, bounded JSON body; unknown or mistyped fields are named.
func decode(r *http.Request, v any) error { return httpx.Decode(r, v) }
