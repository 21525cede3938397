package e2b

import (
	"net"
	"net/http"
	"strings"
)

// EnvdPort is the port E2B SDKs address envd on, in Host names
// ("49983-<id>.<domain>") and in the E2b-Sandbox-Port header.
const EnvdPort = "49983"

// Request headers of the envd protocol (§2, §5.1).
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerAccessToken = "X-Access-Token"
	headerAPIKey      = "X-API-KEY"
)

type destination int

const (
	toNext destination = iota
	toControlPlane
	toEnvd
)

func (d destination) String() string {
	switch d {
	case toControlPlane:
		return "control-plane"
	case toEnvd:
		return "envd"
	default:
		return "next"
	}
}

// route is where one request goes. For envd, SandboxID is the addressed
// sandbox, or "" when only the access token identifies it (old SDKs send
// /files and /health without routing headers).
type route struct {
	Dest      destination
	SandboxID string
}

// controlPlanePrefixes are the E2B control-plane path roots.
var controlPlanePrefixes = []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/templates", "/v2/templates", "/v3/templates"}

// decideRoute picks a destination from headers, Host and path alone.
func decideRoute(r *http.Request) route {
	if id := r.Header.Get(headerSandboxID); id != "" {
		return route{Dest: toEnvd, SandboxID: stripClientID(id)}
	}
	if id, ok := hostSandboxID(r.Host); ok {
		return route{Dest: toEnvd, SandboxID: id}
	}
	// Control-plane requests never carry X-Access-Token; envd requests never
	// carry X-API-KEY. A token alone is the old-SDK envd fallback.
	if r.Header.Get(headerAccessToken) != "" && r.Header.Get(headerAPIKey) == "" {
		return route{Dest: toEnvd}
	}
	if isControlPlanePath(r.URL.Path) {
		return route{Dest: toControlPlane}
	}
	return route{Dest: toNext}
}

func isControlPlanePath(p string) bool {
	for _, prefix := range controlPlanePrefixes {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// hostSandboxID parses "49983-<id>[-<clientID>].<domain>[:port]".
func hostSandboxID(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, rest, ok := strings.Cut(host, ".")
	if !ok || rest == "" {
		return "", false
	}
	port, id, ok := strings.Cut(label, "-")
	if !ok || port != EnvdPort {
		return "", false
	}
	id = stripClientID(id)
	if !validID(id) {
		return "", false
	}
	return id, true
}

// stripClientID drops a legacy "-<clientID>" suffix from a sandbox id.
func stripClientID(id string) string {
	id, _, _ = strings.Cut(id, "-")
	return id
}

func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
