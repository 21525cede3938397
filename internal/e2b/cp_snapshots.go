package e2b

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// E2B snapshots are templates made from a sandbox: Sandbox.create(id or
// name) starts one and DELETE /templates/{id} removes it. They map to
// berth snapshots (the sandbox's files; the sandbox keeps running, frozen
// only for the copy). A sandbox started from one boots from those files.

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotJSON(sn store.Snapshot) snapshotJSON {
	out := snapshotJSON{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		out.Names = append(out.Names, sn.Name)
	}
	return out
}

// handleCreateSnapshot serves POST /sandboxes/{id}/snapshots {"name"?}:
// 201 SnapshotInfo; 404 for a sandbox the caller cannot see; 409 when it
// is not running.
func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	if _, _, err := s.visible(ctx, id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if body.Name != "" {
		if _, err := s.d.Store().GetTemplate(ctx, body.Name); err == nil || body.Name == "base" {
			// Sandbox.create(name) could not tell them apart.
			s.writeAPIError(w, r, errs.Field("name", "%q is the name of a template; choose another snapshot name", body.Name))
			return
		}
	}
	sn, err := s.d.Snapshots().Snapshot(ctx, checkpoint.SnapshotRequest{Owner: owner, Actor: "e2b", ID: id, Name: body.Name})
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b snapshot created", "sandbox_id", id, "owner", owner, "snapshot", sn.ID)
	writeJSON(w, http.StatusCreated, toSnapshotJSON(sn))
}

// handleListSnapshots serves GET /snapshots?sandboxID=&name=&limit=&nextToken=:
// the caller's snapshots, newest first, paged like the sandbox list
// (X-Next-Token only when more exist).
func (s *Server) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeAPIError(w, r, errs.Field("limit", "must be a positive integer; got %q", v))
			return
		}
		limit = min(n, maxListLimit)
	}
	all, err := s.d.Snapshots().ListSnapshots(r.Context(), ownerFrom(r.Context()))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	sandboxID, name := q.Get("sandboxID"), q.Get("name")
	var sel []store.Snapshot
	for _, sn := range all {
		if (sandboxID == "" || sn.SourceSandbox == sandboxID) && (name == "" || sn.Name == name) {
			sel = append(sel, sn)
		}
	}
	page, next, err := snapshotPage(sel, limit, q.Get("nextToken"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := make([]snapshotJSON, 0, len(page))
	for _, sn := range page {
		out = append(out, toSnapshotJSON(sn))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// snapshotPage orders snapshots newest first and returns the page after
// token (the last id of the previous page) and the token of the next one.
func snapshotPage(sns []store.Snapshot, limit int, token string) ([]store.Snapshot, string, error) {
	slices.SortFunc(sns, func(a, b store.Snapshot) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	start := 0
	if token != "" {
		i := slices.IndexFunc(sns, func(sn store.Snapshot) bool { return sn.ID == token })
		if i < 0 {
			return nil, "", errs.Field("nextToken", "unknown or expired token %q", token)
		}
		start = i + 1
	}
	end := min(start+limit, len(sns))
	next := ""
	if end < len(sns) {
		next = sns[end-1].ID
	}
	return sns[start:end], next, nil
}

// createFromSnapshot points req at the caller's snapshot when templateID
// names one (by id or name) rather than a template.
func (s *Server) createFromSnapshot(ctx context.Context, templateID string, req *daemon.CreateRequest) error {
	if templateID == "base" {
		return nil
	}
	if _, err := s.d.Store().GetTemplate(ctx, templateID); err == nil {
		return nil
	}
	sn, ok, err := s.snapshotByRef(ctx, templateID)
	if err != nil || !ok {
		return err
	}
	req.FromSnapshot, req.Template = sn.ID, ""
	return nil
}

// snapshotByRef finds the caller's snapshot by id or name.
func (s *Server) snapshotByRef(ctx context.Context, ref string) (store.Snapshot, bool, error) {
	owner := ownerFrom(ctx)
	sn, err := s.d.Snapshots().GetSnapshot(ctx, owner, ref)
	if err == nil {
		return sn, true, nil
	}
	if !errs.Is(err, errs.NotFound) {
		return store.Snapshot{}, false, err
	}
	all, err := s.d.Snapshots().ListSnapshots(ctx, owner)
	if err != nil {
		return store.Snapshot{}, false, err
	}
	for _, sn := range all {
		if sn.Name != "" && sn.Name == ref {
			return sn, true, nil
		}
	}
	return store.Snapshot{}, false, nil
}

// handleDeleteTemplate serves DELETE /templates/{id}, which the SDK uses for
// Sandbox.deleteSnapshot: 204, 404 (the SDK returns false) when the caller
// has no such snapshot, 409 while sandboxes still boot from it. Templates
// themselves are not deleted over the E2B API.
func (s *Server) handleDeleteTemplate(w http.ResponseWriter, r *http.Request) {
	ctx, ref := r.Context(), r.PathValue("id")
	sn, ok, err := s.snapshotByRef(ctx, ref)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if !ok {
		if _, err := s.d.Store().GetTemplate(ctx, ref); err == nil {
			notImplemented(w, r)
			return
		}
		s.writeAPIError(w, r, errs.E(errs.NotFound, "snapshot %q not found", ref))
		return
	}
	if err := s.d.Snapshots().DeleteSnapshot(ctx, ownerFrom(ctx), sn.ID); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b snapshot deleted", "snapshot", sn.ID, "owner", ownerFrom(ctx))
	w.WriteHeader(http.StatusNoContent)
}

// forkResultJSON is one element of the fork answer: a sandbox, or the
// error that kept it from starting.
type forkResultJSON struct {
	Sandbox *sandboxJSON  `json:"sandbox,omitempty"`
	Error   *apiErrorJSON `json:"error,omitempty"`
}

type apiErrorJSON struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// handleFork serves POST /sandboxes/{id}/fork {"timeout"?, "count"?}: 201
// with one element per requested child, each a Sandbox or an error. The
// children get the parent's files and, where the runtime can checkpoint,
// its memory (berth's fork); endAt = now + timeout, or without a timeout
// the parent's endAt (berth's fork keeps the parent's remaining time).
func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	if _, _, err := s.visible(ctx, id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	res, err := s.d.Checkpoints().Fork(ctx, owner, id, "e2b", count)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := make([]forkResultJSON, 0, count)
	for _, child := range res.Sandboxes {
		var err error
		if body.Timeout != nil {
			var sb *sandbox.Sandbox
			if sb, err = s.d.SetExpiry(ctx, owner, child.ID, s.opts.Now().Add(s.timeoutSeconds(*body.Timeout))); err == nil {
				child = sb
			}
		}
		var tok string
		if err == nil {
			tok, err = s.d.Auth().EnvdToken(ctx, child)
		}
		if err != nil {
			// A child the caller is not told about would run unseen until expiry.
			if derr := s.d.Delete(context.WithoutCancel(ctx), owner, child.ID); derr != nil {
				s.log.Warn("e2b fork: remove unreported child", "sandbox_id", child.ID, "err", derr)
			}
			out = append(out, forkResultJSON{Error: &apiErrorJSON{Code: controlPlaneStatus(errs.KindOf(err)), Message: err.Error()}})
			continue
		}
		j := s.toSandboxJSON(child, tok)
		out = append(out, forkResultJSON{Sandbox: &j})
	}
	for len(out) < count {
		msg := "forked sandbox did not start"
		if res.Reason != "" {
			msg += ": " + res.Reason
		}
		out = append(out, forkResultJSON{Error: &apiErrorJSON{Code: http.StatusInternalServerError, Message: msg}})
	}
	s.log.Info("e2b sandbox forked", "sandbox_id", id, "owner", owner, "children", len(res.Sandboxes), "fork_mode", res.Mode)
	writeJSON(w, http.StatusCreated, out)
}
