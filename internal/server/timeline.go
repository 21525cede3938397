package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/timeline"
)

// timelineAPI serves a sandbox's timeline: checkpoints, rewind, promote.
type timelineAPI struct{ *Server }

func checkpointView(c store.Checkpoint, head string) wire.Checkpoint {
	return wire.Checkpoint{ID: c.ID, Sandbox: c.Sandbox, Seq: c.Seq, Name: c.Name, Layer: c.Layer, Layers: c.Layers,
		Prev: c.Prev, Runtime: c.Runtime, Mode: c.Mode, Reason: c.Reason, Bytes: c.Bytes, Entries: c.Entries,
		Head: head != "" && head == c.ID, Created: c.CreatedAt}
}

func (s timelineAPI) createCheckpoint(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.CheckpointRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	c, err := s.d.Timeline().Checkpoint(r.Context(), timeline.CheckpointRequest{
		Owner: owner(r, p), Actor: p.Owner, ID: r.PathValue("id"), Name: req.Name, Memory: req.Memory})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, checkpointView(c, c.ID))
	return nil
}

func (s timelineAPI) listCheckpoints(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id := r.PathValue("id")
	list, head, err := s.d.Timeline().List(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	out := wire.Timeline{Sandbox: id, Checkpoints: make([]wire.Checkpoint, 0, len(list))}
	if head != nil {
		out.Head = head.Checkpoint
	}
	for _, c := range list {
		out.Checkpoints = append(out.Checkpoints, checkpointView(c, out.Head))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s timelineAPI) getCheckpoint(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	_, head, err := s.d.Timeline().List(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	c, err := s.d.Timeline().Get(r.Context(), owner(r, p), r.PathValue("id"), r.PathValue("ref"))
	if err != nil {
		return err
	}
	h := ""
	if head != nil {
		h = head.Checkpoint
	}
	writeJSON(w, http.StatusOK, checkpointView(c, h))
	return nil
}

func (s timelineAPI) deleteCheckpoint(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := s.d.Timeline().Delete(r.Context(), owner(r, p), r.PathValue("id"), r.PathValue("ref")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s timelineAPI) rewind(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.RewindRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	start := s.d.Now()
	res, err := s.d.Timeline().Rewind(r.Context(), owner(r, p), r.PathValue("id"), req.To, p.Owner)
	if err != nil {
		return err
	}
	out := wire.RewindResult{Sandbox: s.withTasks(r.Context(), sandboxView(res.Sandbox)), Checkpoint: checkpointView(res.Checkpoint, res.Checkpoint.ID),
		Mode: res.Mode, Reason: res.Reason, Millis: res.Millis}
	if rb := s.d.Tasks().LastRollback(r.Context(), res.Sandbox.ID); rb != nil && rb.Checkpoint == res.Checkpoint.ID && !rb.At.Before(start) {
		out.TaskRollback = taskRollbackView(rb) // this rewind's, not an older one's
	}
	out.Note, out.Desync = s.noteOf(r, res.Sandbox.ID) // the point's note (issue 17)
	// The outside effects after the point: listed, never forgotten (issue 18).
	// The rewind happened: a ledger read failing does not turn it into an error.
	after, err := s.d.Effects().Since(r.Context(), res.Sandbox.ID, res.Checkpoint.CreatedAt)
	if err != nil {
		s.d.Log().Warn("rewind: list the effects after the point", "sandbox_id", res.Sandbox.ID, "err", err)
	}
	out.EffectsAfter = effectViews(after)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s timelineAPI) promote(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.PromoteChildRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	res, err := s.d.Timeline().Promote(r.Context(), timeline.PromoteRequest{
		Owner: owner(r, p), Actor: p.Owner, Child: r.PathValue("id"), DiscardOthers: req.DiscardOthers})
	if err != nil {
		return err
	}
	out := wire.PromoteChildResult{From: res.From, Layer: res.Layer, Mode: res.Mode, Reason: res.Reason,
		Discarded: res.Discarded, Millis: res.Millis}
	if res.Parent != nil {
		out.Parent = sandboxView(res.Parent)
	}
	if out.Discarded == nil {
		out.Discarded = []string{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
