package server

import (
	"net/http"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/effects"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
)

// effectsAPI serves a sandbox's side-effect ledger (docs/EFFECTS.md). It
// is reachable from inside the sandbox (the in-sandbox API): a sandbox
// principal reads its own ledger only.
type effectsAPI struct{ *Server }

// effectView is one ledger entry on the wire.
func effectView(v effects.View) wire.Effect {
	return wire.Effect{ID: v.ID, Sandbox: v.SandboxID, Lineage: v.Lineage, Inherited: v.Inherited, Step: v.Step,
		Method: v.Method, Host: v.Host, Path: v.Path, BodySHA256: v.BodySHA256, BodySize: v.BodySize,
		IdempotencyKey: v.Key, KeySource: v.KeySource, Secret: v.Secret, State: v.State, Status: v.Status,
		ResponseSize: v.RespSize, Replayable: v.Replayable, Reason: v.Reason, StartedAt: v.StartedAt, EndedAt: v.EndedAt}
}

func effectViews(vs []effects.View) []wire.Effect {
	out := make([]wire.Effect, 0, len(vs))
	for _, v := range vs {
		out = append(out, effectView(v))
	}
	return out
}

// effectPolicy reads a request's effect settings (nil: none).
func effectPolicy(w *wire.EffectSettings) (egress.EffectPolicy, error) {
	if w == nil {
		return egress.EffectPolicy{}, nil
	}
	return egress.ParseEffectPolicy(w.Effectful, w.Idempotency, w.Repeat)
}

// effectSettings is a policy's effect settings on the wire (nil: none).
func effectSettings(e egress.EffectPolicy) *wire.EffectSettings {
	if e.IsZero() {
		return nil
	}
	return &wire.EffectSettings{Effectful: ruleStrings(e.Hosts), Idempotency: e.Idempotency, Repeat: e.Repeat}
}

// sandboxTarget is the sandbox a request names: a sandbox principal may
// name only itself ("self" or its id); anything else is NotFound to it.
func sandboxTarget(r *http.Request, p daemon.Principal) (string, error) {
	id := r.PathValue("id")
	if p.Sandbox == "" {
		return id, nil
	}
	if id == "self" {
		id = p.Sandbox
	}
	if id != p.Sandbox {
		return "", errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return id, nil
}

// listEffects is GET /v1/sandboxes/{id}/effects[?since=TIME|CHECKPOINT].
func (s effectsAPI) listEffects(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id, err := sandboxTarget(r, p)
	if err != nil {
		return err
	}
	since := r.URL.Query().Get("since")
	var t time.Time
	if since != "" {
		if t, err = time.Parse(time.RFC3339Nano, since); err != nil {
			c, cerr := s.d.Timeline().Get(r.Context(), owner(r, p), id, since)
			if cerr != nil {
				if errs.Is(cerr, errs.NotFound) {
					return errs.Field("since", "%q is neither an RFC 3339 time nor a checkpoint of %s", since, id)
				}
				return cerr
			}
			t = c.CreatedAt
		}
	}
	list, err := s.d.Effects().List(r.Context(), owner(r, p), id, t)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.EffectList{Sandbox: id, Since: since, Effects: effectViews(list)})
	return nil
}
