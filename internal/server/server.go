// Package server serves berth's REST API under /v1. Handlers are thin: they
// authenticate, decode, call the daemon and encode; error kinds become HTTP
// statuses in exactly one place (internal/httpx's Status).
package server

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
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
	s.mux.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(api.OpenAPI)
	})
	s.mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, wire.Health{OK: true})
	})
	s.handle("GET /v1/info", s.info)

	s.handle("POST /v1/sandboxes", s.createSandbox)
	s.handle("GET /v1/sandboxes", s.listSandboxes)
	s.handle("GET /v1/sandboxes/{id}", s.getSandbox)
	s.handle("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	s.handle("POST /v1/sandboxes/{id}/stop", s.stopSandbox)
	s.handle("POST /v1/sandboxes/{id}/start", s.startSandbox)
	s.handle("POST /v1/sandboxes/{id}/extend", s.extendSandbox)
	s.handle("POST /v1/sandboxes/{id}/pause", s.pauseSandbox)
	s.handle("POST /v1/sandboxes/{id}/resume", s.resumeSandbox)
	s.handle("POST /v1/sandboxes/{id}/lease", s.leaseSandbox)
	s.handle("GET /v1/sandboxes/{id}/events", s.sandboxEvents)
	s.handle("GET /v1/sandboxes/{id}/net", s.getNetwork)
	s.handle("PUT /v1/sandboxes/{id}/net", s.setNetwork)
	s.handle("GET /v1/sandboxes/{id}/net/log", s.egressLog)
	s.handle("POST /v1/sandboxes/{id}/ports", s.exposePort)
	s.handle("GET /v1/sandboxes/{id}/ports", s.listPorts)
	s.handle("DELETE /v1/sandboxes/{id}/ports/{port}", s.closePort)
	s.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy) // any method; authenticates itself
	s.handle("GET /v1/secrets", s.listSecrets)
	s.handle("PUT /v1/secrets/{name}", s.putSecret)
	s.handle("DELETE /v1/secrets/{name}", s.deleteSecret)
	s.handle("POST /v1/sandboxes/{id}/snapshot", s.snapshotSandbox)
	s.handle("POST /v1/sandboxes/{id}/fork", s.forkSandbox)
	s.handle("GET /v1/snapshots", s.listSnapshots)
	s.handle("GET /v1/snapshots/{id}", s.getSnapshot)
	s.handle("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	s.handle("POST /v1/snapshots/{id}/template", s.promoteSnapshot)
	s.handle("GET /v1/pools", s.listPools)
	s.handle("PUT /v1/pools/{template}", s.setPool)
	s.handle("DELETE /v1/pools/{template}", s.deletePool)

	s.handle("POST /v1/sandboxes/{id}/exec", s.exec)
	s.handle("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/attach", s.attach)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.stdin)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/close-stdin", s.closeStdin)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signal)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/resize", s.resize)

	s.handle("GET /v1/sandboxes/{id}/files", s.readFile)
	s.handle("PUT /v1/sandboxes/{id}/files", s.writeFile)
	s.handle("POST /v1/sandboxes/{id}/fs/{op}", s.fsOp)

	s.handle("GET /v1/events", s.allEvents)
	s.handle("GET /v1/templates", s.listTemplates)
	s.handle("GET /v1/templates/{name}", s.getTemplate)
	s.handle("PUT /v1/templates/{name}/tar", s.importTemplate)
	s.handle("POST /v1/templates/{name}/pull", s.pullTemplate)
	s.handle("POST /v1/templates/{name}/build", s.buildTemplate)
	s.handle("DELETE /v1/templates/{name}", s.deleteTemplate)
	s.handle("POST /v1/keys", s.createKey)

	s.handle("GET /v1/usage", s.usage)
	s.handle("GET /v1/reports/orphans", s.orphans)
	s.handle("GET /v1/quotas", s.listQuotas)
	s.handle("GET /v1/quotas/{owner}", s.getQuota)
	s.handle("PUT /v1/quotas/{owner}", s.putQuota)
	s.handle("DELETE /v1/quotas/{owner}", s.deleteQuota)
	s.handle("GET /metrics", s.metrics)

	s.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.E(errs.NotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
}

// handle registers an authenticated route.
func (s *Server) handle(pattern string, h handler) {
	client := clientRoute(pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		p, err := s.d.Auth().Authenticate(r.Context(), apiKey(r))
		if err == nil {
			if client {
				// A client of the sandbox until the request ends (exec/attach
				// streams, file transfers): the reaper leaves it be.
				// Only once the caller may see it: another tenant's
				// refused requests must not keep it awake.
				defer s.d.Admission().OpenClientStream(r.Context(), owner(r, p), r.PathValue("id"))()
			}
			err = h(w, r, p)
		}
		if err != nil {
			if errs.KindOf(err) == errs.Internal {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

func apiKey(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	return ""
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
