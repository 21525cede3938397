package e2b

import (
	"encoding/json"
	"net/http"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/sandbox"
)

// newSandboxJSON is E2B's NewSandbox body (§3.3). Extras E2B accepts but
// berth does not act on (iam, mcp) are ignored; settings that would weaken
// or change isolation and cannot be honoured are rejected.
type newSandboxJSON struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResumeJSON   `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
}

type autoResumeJSON struct {
	Enabled bool `json:"enabled"`
}

// Default create timeouts when the body has none (§3.3).
const (
	defaultTimeoutV1 = 15 * time.Second
	defaultTimeoutV2 = 300 * time.Second
)

// createRequest translates a NewSandbox body into a daemon request.
func (s *Server) createRequest(owner string, body newSandboxJSON, v2 bool) (daemon.CreateRequest, error) {
	if body.TemplateID == "" {
		return daemon.CreateRequest{}, errs.Field("templateID", "is required (E2B's default is \"base\")")
	}
	if len(body.VolumeMounts) > 0 {
		return daemon.CreateRequest{}, errs.Field("volumeMounts", "volumes are not supported by berth")
	}
	public, err := parseNetwork(body.Network)
	if err != nil {
		return daemon.CreateRequest{}, err
	}
	ttl := defaultTimeoutV2
	if !v2 {
		ttl = defaultTimeoutV1
	}
	if body.Timeout != nil {
		ttl = s.timeoutSeconds(*body.Timeout)
	}
	ttl = min(ttl, s.opts.MaxTimeout)
	tmpl := body.TemplateID
	if tmpl == "base" {
		tmpl = s.opts.BaseTemplate
	}
	req := daemon.CreateRequest{
		Owner:        owner,
		Actor:        "e2b",
		Template:     tmpl,
		TTL:          ttl,
		ExpiryAction: sandbox.ExpireDelete,
		Labels:       body.Metadata,
		Env:          body.EnvVars,
	}
	if body.AutoPause {
		req.ExpiryAction = sandbox.ExpirePause
		// autoPauseMemory (default true; SDK lifecycle.onTimeout.keepMemory)
		// false: a filesystem-only pause at expiry, berth's disk pause.
		if body.AutoPauseMemory != nil && !*body.AutoPauseMemory {
			req.Attrs.ExpiryPauseMode = sandbox.PauseDisk
		}
	}
	req.Attrs.PublicTraffic = public
	if body.AutoResume != nil && body.AutoResume.Enabled {
		if req.Attrs.ExpiryPauseMode == sandbox.PauseDisk {
			// As E2B (and the SDK, before sending): traffic does not resume
			// a filesystem-only pause; Sandbox.connect() does.
			return daemon.CreateRequest{}, errs.Field("autoResume", "cannot be enabled with autoPauseMemory: false (a filesystem-only pause is resumed by connect)")
		}
		req.AutoResume = true
	}
	// E2B's allow_internet_access (SDK option allowInternetAccess; 2.9 sends
	// true when unset, 2.50+ only when set): false is no egress at all,
	// true is the open internet (public addresses; berth never opens the
	// operator's private ranges to a tenant). Absent is the server default.
	if body.AllowInternetAccess != nil {
		req.Network = string(egress.DenyAll)
		if *body.AllowInternetAccess {
			req.Network = string(egress.AllowAll)
		}
	}
	return req, nil
}

// parseNetwork reads E2B's network object on create. Only
// allowPublicTraffic is honoured (true: the sandbox's host-routed user
// ports need no credential; false or absent: berth's default, private);
// E2B's egress rules (allowOut, denyOut, rules, egressProxy) and
// maskRequestHost/httpsPorts are rejected naming the field, as berth
// cannot honour them (its egress policy is /v1's).
func parseNetwork(raw json.RawMessage) (public bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return false, errs.Field("network", "must be an object")
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := fields[k]
		if k == "allowPublicTraffic" {
			if string(v) == "null" {
				continue
			}
			if err := json.Unmarshal(v, &public); err != nil {
				return false, errs.Field("network.allowPublicTraffic", "must be a boolean, got %s", truncate(string(v), 40))
			}
			continue
		}
		if string(v) == "null" {
			continue
		}
		return false, errs.Field("network."+k, "E2B network rules are not supported by berth (only allowPublicTraffic is); use berth's /v1 network policy")
	}
	return public, nil
}

// truncate shortens s to at most n bytes for an error message.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// policyBuilder is the part of the daemon that says whether this server
// can give a sandbox egress at all (hostnet.Service.BuildPolicy).
type policyBuilder interface {
	Net() *hostnet.Service
}

// handleCreate serves POST /sandboxes (v1) and POST /v2/sandboxes.
func (s *Server) handleCreate(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body newSandboxJSON
		if err := decodeBody(r, &body); err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		req, err := s.createRequest(ownerFrom(r.Context()), body, v2)
		if err == nil {
			req.ID, err = auth.GivenSandboxID(r, principalFrom(r.Context()))
			req.ClusterAdopt = principalFrom(r.Context()).Cluster // no id: a warm hit the replica records from this answer
		}
		if err == nil {
			err = s.createFromSnapshot(r.Context(), body.TemplateID, &req)
		}
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		if pb, ok := s.d.(policyBuilder); ok && req.Network == string(egress.AllowAll) {
			if _, err := pb.Net().BuildPolicy(req.Network, nil, nil); errs.Is(err, errs.FailedPrecondition) {
				// The server forbids egress (networking disabled): the
				// sandbox gets what every sandbox here gets, no network.
				req.Network = ""
			}
		}
		sb, err := s.d.Create(r.Context(), req)
		if err != nil {
			if errs.Is(err, errs.NotFound) && errs.FieldOf(err) == "" {
				// The only thing create can fail to find is the template.
				err = errs.Reclassify(errs.InvalidArgument, err, "templateID: unknown template %q", body.TemplateID)
			}
			s.writeAPIError(w, r, err)
			return
		}
		s.log.Info("e2b sandbox created", "sandbox_id", sb.ID, "template", sb.Template, "owner", sb.Owner)
		tok, err := s.d.Auth().EnvdToken(r.Context(), sb)
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.toSandboxJSON(sb, tok))
	}
}
