package e2b

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/sandbox"
)

// controlPlane is the E2B REST API (§3). Every route is authenticated by
// X-API-KEY; every error is {code, message}.
func (s *Server) controlPlane() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.authed(s.handleCreate(false)))
	mux.HandleFunc("POST /v2/sandboxes", s.authed(s.handleCreate(true)))
	mux.HandleFunc("GET /v2/sandboxes", s.authed(s.handleList))
	mux.HandleFunc("GET /sandboxes", s.authed(s.handleListV1))
	mux.HandleFunc("GET /sandboxes/{id}", s.authed(s.handleGetInfo))
	mux.HandleFunc("DELETE /sandboxes/{id}", s.authed(s.handleKill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.authed(s.handleTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.authed(s.handlePause))
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.authed(s.handleConnect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.authed(s.handleConnect))
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.authed(s.handleConnect))
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.authed(s.handleMetrics))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.authed(s.handleCreateSnapshot))
	mux.HandleFunc("GET /snapshots", s.authed(s.handleListSnapshots))
	mux.HandleFunc("DELETE /templates/{id}", s.authed(s.handleDeleteTemplate))
	mux.HandleFunc("POST /sandboxes/{id}/fork", s.authed(s.handleFork))
	// Optional endpoints berth does not serve (§10): 501 JSON.
	for _, p := range []string{
		"PUT /sandboxes/{id}/network",
		"POST /sandboxes/{id}/refreshes", "GET /sandboxes/{id}/logs", "GET /v2/sandboxes/{id}/logs",
		"GET /sandboxes/metrics", "/snapshots", "/snapshots/", "/templates", "/templates/",
		"/v2/templates", "/v2/templates/", "/v3/templates", "/v3/templates/",
	} {
		mux.HandleFunc(p, s.authed(notImplemented))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusNotFound, "no E2B route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func notImplemented(w http.ResponseWriter, r *http.Request) {
	writeStatus(w, http.StatusNotImplemented, r.Method+" "+r.URL.Path+" is not implemented by berth")
}

type ownerKey struct{}

// principalKey holds the whole principal (a replica's signed request is
// the only one that may choose a sandbox's id: auth.GivenSandboxID).
type principalKey struct{}

func principalFrom(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	return p
}

func ownerFrom(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// authed resolves X-API-KEY to an owner.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// An API replica's signed request acts as the principal it names
		// (cluster mode); with no cluster headers, the key decides.
		p, cluster, err := s.d.Auth().ClusterPrincipal(r)
		key := r.Header.Get(headerAPIKey)
		if err == nil && !cluster {
			if key == "" {
				writeStatus(w, http.StatusUnauthorized, "missing X-API-KEY header")
				return
			}
			p, err = s.d.Auth().Authenticate(r.Context(), key)
		}
		if err == nil && p.Owner == "" {
			// An owner "" would be the daemon's every-owner view; E2B has none.
			err = errs.E(errs.Unauthenticated, "a cluster request to the E2B API must name an owner")
		}
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		// E2B has no admin view: even the admin key sees its own sandboxes.
		ctx := context.WithValue(context.WithValue(r.Context(), ownerKey{}, p.Owner), principalKey{}, p)
		s.audited(w, r.WithContext(ctx), p.Owner, h) // audit.go
	}
}

// decodeBody decodes an optional, bounded JSON body into v; an empty body
// leaves v as is. Unknown fields are ignored (the SDKs send fields berth does
// not know); a mistyped one is an error naming it.
func decodeBody(r *http.Request, v any) error { return httpx.DecodeLenient(r, v) }

// timeoutSeconds converts an E2B timeout (integer seconds) to a duration,
// treating negatives as 0 and capping at MaxTimeout.
func (s *Server) timeoutSeconds(sec int64) time.Duration {
	if sec >= int64(s.opts.MaxTimeout/time.Second) {
		return s.opts.MaxTimeout // also where sec * time.Second would overflow
	}
	return time.Duration(max(sec, 0)) * time.Second
}

// e2bState is the state E2B shows: only running and paused exist there.
// Other states (stopped, failed, deleted) are invisible, as if killed.
func e2bState(st sandbox.State) (string, bool) {
	switch st {
	case sandbox.Running, sandbox.Resuming, sandbox.Creating:
		return "running", true
	case sandbox.Paused, sandbox.Pausing:
		return "paused", true
	}
	return "", false
}

// e2bTemplate is the template ID shown to E2B clients.
func (s *Server) e2bTemplate(sb *sandbox.Sandbox) string {
	if sb.Template == s.opts.BaseTemplate {
		return "base"
	}
	return sb.Template
}

// sandboxJSON is E2B's Sandbox (create/connect answers).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// networkJSON is the part of E2B's SandboxNetworkConfig berth honours.
type networkJSON struct {
	AllowPublicTraffic bool `json:"allowPublicTraffic"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
	// KeepMemory (berth's addition, the SDK ignores it) says whether an
	// expiry pause keeps memory: false for autoPauseMemory: false.
	KeepMemory *bool `json:"keepMemory,omitempty"`
}

// detailJSON is E2B's SandboxDetail and, without the detail-only fields,
// ListedSandbox. PauseMode/PauseRequested are berth's own additions (E2B has
// no such field; the SDK ignores extra fields).
type detailJSON struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	Alias           string            `json:"alias,omitempty"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	State           string            `json:"state"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	Lifecycle       *lifecycleJSON    `json:"lifecycle,omitempty"`
	Network         *networkJSON      `json:"network,omitempty"`
	PauseMode       string            `json:"pause_mode,omitempty"`
	PauseRequested  string            `json:"pause_mode_requested,omitempty"`
}

func (s *Server) domain() *string {
	if s.opts.Domain == "" {
		return nil
	}
	d := s.opts.Domain
	return &d
}

// toSandboxJSON renders Sandbox; token is its envd access token (the
// store keeps only its hash, Backend.EnvdToken derives it). The traffic
// access token, derived from it, authenticates requests to the sandbox's
// other ports (sandboxport.go).
func (s *Server) toSandboxJSON(sb *sandbox.Sandbox, token string) sandboxJSON {
	out := sandboxJSON{
		SandboxID:       sb.ID,
		TemplateID:      s.e2bTemplate(sb),
		ClientID:        clientID,
		EnvdVersion:     EnvdVersion,
		EnvdAccessToken: token,
		Domain:          s.domain(),
	}
	if tt := trafficToken(token); tt != "" {
		out.TrafficAccessToken = &tt
	}
	return out
}

// toDetailJSON renders SandboxDetail (detail=true, with the envd token) or
// ListedSandbox (token unused).
func (s *Server) toDetailJSON(sb *sandbox.Sandbox, state string, detail bool, token string) detailJSON {
	// E2B's startedAt is when the caller got the sandbox: for a warm-pool
	// member that is its claim (CreatedAt), not its boot, so the value shown
	// agrees with the startedAfter filter (list matches on CreatedAt).
	started := sb.StartedAt
	if started.IsZero() || sb.CreatedAt.After(started) {
		started = sb.CreatedAt
	}
	cpus := (sb.Resources.CPUMillis + 999) / 1000
	out := detailJSON{
		SandboxID:   sb.ID,
		TemplateID:  s.e2bTemplate(sb),
		ClientID:    clientID,
		EnvdVersion: EnvdVersion,
		StartedAt:   started.UTC(),
		EndAt:       sb.ExpiresAt.UTC(),
		State:       state,
		CPUCount:    cpus,
		MemoryMB:    sb.Resources.MemoryMiB,
		DiskSizeMB:  sb.Resources.DiskMiB,
		Metadata:    sb.Labels,
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if state == "paused" {
		out.PauseMode = string(sb.PauseActual)
		out.PauseRequested = string(sb.PauseRequested)
	}
	if detail {
		out.EnvdAccessToken = token
		out.Domain = s.domain()
		onTimeout := "kill"
		if sb.ExpiryAction == sandbox.ExpirePause {
			onTimeout = "pause"
		}
		out.Lifecycle = &lifecycleJSON{OnTimeout: onTimeout, AutoResume: sb.AutoResume}
		out.Network = &networkJSON{AllowPublicTraffic: sb.PublicTraffic}
		if sb.ExpiryAction == sandbox.ExpirePause {
			keep := sb.ExpiryPauseMode != sandbox.PauseDisk
			out.Lifecycle.KeepMemory = &keep
		}
	}
	return out
}

// visible fetches a sandbox the owner can see in E2B terms: a stopped or
// failed berth sandbox is reported as not found, like a killed E2B one.
func (s *Server) visible(ctx context.Context, id string) (*sandbox.Sandbox, string, error) {
	sb, err := s.d.Get(ctx, ownerFrom(ctx), id)
	if err != nil {
		return nil, "", err
	}
	state, ok := e2bState(sb.State)
	if !ok {
		return nil, "", errs.E(errs.NotFound, "sandbox %q is %s", id, sb.State)
	}
	return sb, state, nil
}
