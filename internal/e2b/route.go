package e2b

import (
	"net"
	"net/http"
	"strings"
)

// EnvdPort is the port E2B SDKs address envd on, in Host names
// ("49983-<id>.<domain>") and in the E2b-Sandbox-Port header.
const EnvdPort = "49983"

// Request headers of the envd protocol (§2, §5.1). E2b-Sandbox-Port names
// the sandbox port a request is for (envd when absent); E2B-Traffic-Access-
// Token is what SDKs send to ports other than envd (@e2b/code-interpreter's
// /contexts calls carry no X-Access-Token).
const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerAccessToken  = "X-Access-Token"
	headerTrafficToken = "E2B-Traffic-Access-Token"
	headerAPIKey       = "X-API-KEY"
)

type destination int

const (
	toNext destination = iota
	toControlPlane
	toEnvd
	toPort // another port of the sandbox (the code interpreter's 49999, a user's server)
)

func (d destination) String() string {
	switch d {
	case toControlPlane:
		return "control-plane"
	case toEnvd:
		return "envd"
	case toPort:
		return "port"
	default:
		return "next"
	}
}

// route is where one request goes. For envd, SandboxID is the addressed
// sandbox, or "" when only the access token identifies it (old SDKs send
// /files and /health without routing headers). For toPort, Port is the
// sandbox port (as sent: serveSandboxPort validates it).
type route struct {
	Dest      destination
	SandboxID string
	Port      string
}

// controlPlanePrefixes are the E2B control-plane path roots.
var controlPlanePrefixes = []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/templates", "/v2/templates", "/v3/templates"}

// decideRoute picks a destination from headers, Host and path alone.
func decideRoute(r *http.Request) route {
	if id := r.Header.Get(headerSandboxID); id != "" {
		if port := strings.TrimSpace(r.Header.Get(headerSandboxPort)); port != "" && port != EnvdPort {
			return route{Dest: toPort, SandboxID: stripClientID(id), Port: port}
		}
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
	// A signed file URL built on E2B_SANDBOX_URL names no sandbox: its
	// signature does (envd_signed.go).
	if isSignedFiles(r) && r.Header.Get(headerAPIKey) == "" {
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
