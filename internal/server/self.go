package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

// selfRoutes is the allowlist of the in-sandbox API (docs/STATE.md "Inside
// the sandbox"): the REST routes a request from inside a sandbox (a
// principal with Sandbox set) may reach, each only for that sandbox's own
// {id}. Every other route answers such a request 403.
//
// To add a route: one line below, the pattern exactly as registered with
// s.handle in server.go (method, space, path, under /v1/sandboxes/{id}),
// and make its handler correct for p.Sandbox != "": it acts on that
// sandbox only and refuses what a sandbox must not do to itself (approve
// its own gate, revoke audit, ...). self_test.go checks the patterns'
// shape.
var selfRoutes = map[string]bool{
	"GET /v1/sandboxes/{id}": true, // its own info

	// Task ledger (tasks.go): read, steps, ask a gate — never decide one.
	"GET /v1/sandboxes/{id}/tasks":                           true,
	"POST /v1/sandboxes/{id}/tasks":                          true,
	"GET /v1/sandboxes/{id}/tasks/{task}":                    true,
	"GET /v1/sandboxes/{id}/tasks/{task}/history":            true,
	"POST /v1/sandboxes/{id}/tasks/{task}/steps":             true,
	"POST /v1/sandboxes/{id}/tasks/{task}/steps/{step}/{op}": true,
	"POST /v1/sandboxes/{id}/tasks/{task}/gates":             true,

	// Handoff notes (notes.go): the agent's own fields and its notes.
	"GET /v1/sandboxes/{id}/note":        true,
	"POST /v1/sandboxes/{id}/note":       true,
	"GET /v1/sandboxes/{id}/notes":       true,
	"GET /v1/sandboxes/{id}/notes/{seq}": true,

	// Side effects (effects.go): what already happened, before a retry.
	"GET /v1/sandboxes/{id}/effects": true,

	// Credential leases (leases.go): the current placeholders, after a resume.
	"GET /v1/sandboxes/{id}/leases": true,
}

// selfPrincipalKey carries a sandbox principal from ServeSelf to the
// routes; only ServeSelf sets it, so nothing a client sends makes one.
type selfPrincipalKey struct{}

// ServeSelf serves a request from inside sandbox p.Sandbox (the daemon's
// in-sandbox API, internal/daemon/selfapi.go, which has authenticated the
// channel and rewritten /v1/sandboxes/self): routes outside selfRoutes are
// refused here, and again, with the {id} check, in s.handle.
func (s *Server) ServeSelf(w http.ResponseWriter, r *http.Request, p daemon.Principal) {
	if p.Sandbox == "" || p.Admin || p.Owner == "" {
		writeError(w, errs.E(errs.Internal, "in-sandbox API: not a sandbox principal"))
		return
	}
	if _, pattern := s.mux.Handler(r); !selfRoutes[pattern] {
		refused := errs.E(errs.PermissionDenied,
			"%s %s is not available from inside a sandbox (the in-sandbox API allows only its own state: docs/STATE.md)",
			r.Method, r.URL.Path)
		// The refusal is an audit entry of that sandbox (actor sandbox:<id>).
		_ = s.audited(pattern, func(http.ResponseWriter, *http.Request, daemon.Principal) error { return refused }, w, r, p)
		writeError(w, refused)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), selfPrincipalKey{}, p)))
}

// selfPrincipal is the sandbox principal ServeSelf put on the request.
func selfPrincipal(r *http.Request) (daemon.Principal, bool) {
	p, ok := r.Context().Value(selfPrincipalKey{}).(daemon.Principal)
	return p, ok && p.Sandbox != ""
}

// checkSelf is the allowlist check of a sandbox principal on the route
// registered as pattern, whose {id} is id.
func checkSelf(pattern, id string, p daemon.Principal) error {
	if p.Sandbox == "" {
		return nil
	}
	if !selfRoutes[pattern] {
		return errs.E(errs.PermissionDenied, "%s is not available from inside a sandbox (docs/STATE.md)", pattern)
	}
	if id != p.Sandbox {
		return errs.E(errs.PermissionDenied, "a sandbox reaches only its own state: the path names %q, this sandbox is %q", id, p.Sandbox)
	}
	return nil
}

// selfPatternOK reports whether an allowlist entry has the shape a sandbox
// route must have: a method and a path under /v1/sandboxes/{id}.
func selfPatternOK(pattern string) bool {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || method == "" || strings.ToUpper(method) != method {
		return false
	}
	return path == "/v1/sandboxes/{id}" || strings.HasPrefix(path, "/v1/sandboxes/{id}/")
}
