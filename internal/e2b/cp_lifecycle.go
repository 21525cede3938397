package e2b

import (
	"net/http"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/notes"
	"github.com/berth-dev/berth/internal/sandbox"
)

// handleGetInfo serves GET /sandboxes/{id} (SandboxDetail).
func (s *Server) handleGetInfo(w http.ResponseWriter, r *http.Request) {
	sb, state, err := s.visible(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	tok, err := s.d.Auth().EnvdToken(r.Context(), sb)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toDetailJSON(sb, state, true, tok))
}

// handleKill serves DELETE /sandboxes/{id}: 204, or 404 when there is
// nothing to kill (the SDK returns false).
func (s *Server) handleKill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.d.Delete(r.Context(), ownerFrom(r.Context()), id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b sandbox killed", "sandbox_id", id, "owner", ownerFrom(r.Context()))
	w.WriteHeader(http.StatusNoContent)
}

// handleTimeout serves POST /sandboxes/{id}/timeout {"timeout": s}: endAt =
// now + timeout, shorter or longer. A paused sandbox is 404 (§3.2).
func (s *Server) handleTimeout(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if body.Timeout == nil {
		s.writeAPIError(w, r, errs.Field("timeout", "is required (integer seconds)"))
		return
	}
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	_, state, err := s.visible(ctx, id)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if state != "running" {
		s.writeAPIError(w, r, errs.E(errs.NotFound, "sandbox %q is paused; connect to resume it first", id))
		return
	}
	if _, err := s.d.SetExpiry(ctx, owner, id, s.opts.Now().Add(s.timeoutSeconds(*body.Timeout))); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseMode picks the berth pause mode for an E2B pause: memory (processes
// survive) when asked for and the sandbox's runtime can checkpoint, else
// disk. The mode actually used shows in getInfo's pause_mode.
func (s *Server) pauseMode(memory *bool, runtimeName string) sandbox.PauseMode {
	if (memory == nil || *memory) && s.d.Checkpoints().MemoryPauseSupported(runtimeName) {
		return sandbox.PauseMemory
	}
	return sandbox.PauseDisk
}

// handlePause serves POST /sandboxes/{id}/pause {"memory"?}: 204, or 409
// when already paused or transitioning (the SDK returns false).
func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	sb, _, err := s.visible(ctx, id)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if sb.State != sandbox.Running {
		s.writeAPIError(w, r, errs.E(errs.Conflict, "sandbox %q is %s", id, sb.State))
		return
	}
	mode := s.pauseMode(body.Memory, sb.Runtime)
	sb, err = s.d.Checkpoints().Pause(ctx, owner, id, mode)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b sandbox paused", "sandbox_id", id, "owner", owner, "mode", mode, "actual", sb.PauseActual)
	w.WriteHeader(http.StatusNoContent)
}

// connectBody is E2B's Connect body; timeout defaults to 300 s.
type connectBody struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// handleConnect serves POST /v2/sandboxes/{id}/connect, the v1 path and the
// 2.0–2.3 /resume: a running sandbox only has its endAt extended (200); a
// paused one is resumed with endAt = now + timeout (201). The answer always
// carries the same id and envdAccessToken.
func (s *Server) handleConnect(w http.ResponseWriter, r *http.Request) {
	var body connectBody
	if err := decodeBody(r, &body); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	ttl := defaultTimeoutV2
	if body.Timeout != nil {
		ttl = s.timeoutSeconds(*body.Timeout)
	}
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	sb, err := s.d.Get(ctx, owner, id)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	status := http.StatusOK
	switch sb.State {
	case sandbox.Running:
	case sandbox.Paused:
		// memory:false (onResume: 'reboot') asks for a cold boot from disk.
		resume := s.d.Checkpoints().Resume
		if body.Memory != nil && !*body.Memory {
			resume = s.d.Checkpoints().ResumeCold
		}
		if sb, err = resume(ctx, owner, id); err != nil {
			if !errs.Is(err, errs.Conflict) {
				s.writeAPIError(w, r, err)
				return
			}
			// Resumed concurrently (auto-resume, another client): fine if running now.
			if sb, err = s.d.Get(ctx, owner, id); err != nil || sb.State != sandbox.Running {
				s.writeAPIError(w, r, errs.E(errs.Conflict, "sandbox %q is being resumed; retry", id))
				return
			}
		}
		status = http.StatusCreated
		s.log.Info("e2b sandbox resumed", "sandbox_id", id, "owner", owner)
	case sandbox.Creating, sandbox.Pausing, sandbox.Resuming:
		s.writeAPIError(w, r, errs.E(errs.Conflict, "sandbox %q is %s; retry", id, sb.State))
		return
	default:
		s.writeAPIError(w, r, errs.E(errs.NotFound, "sandbox %q is %s", id, sb.State))
		return
	}
	end := s.opts.Now().Add(ttl)
	if status == http.StatusCreated || end.After(sb.ExpiresAt) {
		if sb, err = s.d.SetExpiry(ctx, owner, id, end); err != nil {
			s.writeAPIError(w, r, err)
			return
		}
	}
	tok, err := s.d.Auth().EnvdToken(ctx, sb)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := connectJSON{sandboxJSON: s.toSandboxJSON(sb, tok)}
	if nt := s.d.Notes(); nt != nil {
		if cur, err := nt.Latest(ctx, owner, id); err == nil {
			out.Note, out.Desync = cur.Note, cur.Desync
		}
	}
	writeJSON(w, status, out)
}

// connectJSON is the connect answer: E2B's Sandbox plus berth's handoff
// note and desync (issue 17), extra fields the SDKs ignore.
type connectJSON struct {
	sandboxJSON
	Note   *notes.Note   `json:"note,omitempty"`
	Desync *notes.Desync `json:"desync,omitempty"`
}
