package e2b

import (
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Cluster mode's API replica (internal/cluster/api) runs no Server: it
// has no daemon, and sends everything sandbox-scoped to the node that runs
// the sandbox. It routes as a Server would, with these pure helpers, so
// both decide alike.

// Target kinds of Route.
const (
	TargetNext         = "next"          // not E2B traffic: berth's /v1 API
	TargetControlPlane = "control-plane" // E2B's REST API
	TargetEnvd         = "envd"          // a sandbox's envd (SandboxID "" when only the access token names it)
	TargetPort         = "port"          // another port of a sandbox
)

// Target is where Route sends a request.
type Target struct {
	Kind      string
	SandboxID string
	Port      string
}

// Route decides like Handler: a Host "<port>-<id>.<domain>" names a
// sandbox port (envd's port is envd), then the routing headers, the access
// token and the path decide. A malformed sandbox host name is an error
// naming the field "host".
func Route(r *http.Request, domain string) (Target, error) {
	if t, ok, err := parseSandboxHost(r.Host, domain); err != nil {
		return Target{}, err
	} else if ok {
		if t.port == EnvdPort {
			return Target{Kind: TargetEnvd, SandboxID: t.id}, nil
		}
		return Target{Kind: TargetPort, SandboxID: t.id, Port: t.port}, nil
	}
	rt := decideRoute(r)
	return Target{Kind: rt.Dest.String(), SandboxID: rt.SandboxID, Port: rt.Port}, nil
}

// ListFilter translates a GET /v2/sandboxes query for owner, E2B's
// "base" template being baseTemplate.
func ListFilter(owner, baseTemplate string, q url.Values) (daemon.ListFilter, error) {
	return listFilterFor(owner, baseTemplate, q)
}

// Listed renders sb as E2B's ListedSandbox, or ok=false when E2B would not
// show it (stopped, failed, lost...: as if killed).
func Listed(sb *sandbox.Sandbox, baseTemplate string) (v any, ok bool) {
	state, ok := e2bState(sb.State)
	if !ok {
		return nil, false
	}
	s := &Server{opts: Options{BaseTemplate: baseTemplate}}
	return s.toDetailJSON(sb, state, false, ""), true
}

// StatusBody is E2B's error body {code, message}.
func StatusBody(status int, msg string) any { return apiError{Code: status, Message: msg} }
