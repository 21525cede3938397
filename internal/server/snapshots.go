package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Snapshot is the API view of a snapshot.
type Snapshot = wire.Snapshot

func snapshotView(s store.Snapshot) Snapshot {
	return Snapshot{ID: s.ID, Owner: s.Owner, Name: s.Name, SourceSandbox: s.SourceSandbox, Template: s.Template,
		TemplateID: s.TemplateID, Runtime: s.Runtime, Layers: s.Layers, Memory: s.MemoryPath != "",
		CreatedAt: s.CreatedAt, Extra: s.Extra}
}

type snapshotRequest = wire.SnapshotRequest

func (s imageAPI) snapshotSandbox(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req snapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sn, err := s.d.Snapshots().Snapshot(r.Context(), checkpoint.SnapshotRequest{Owner: owner(r, p), Actor: p.Owner, ID: r.PathValue("id"), Name: req.Name})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotView(sn))
	return nil
}

func (s imageAPI) listSnapshots(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	list, err := s.d.Snapshots().ListSnapshots(r.Context(), owner(r, p))
	if err != nil {
		return err
	}
	out := make([]Snapshot, 0, len(list))
	for _, sn := range list {
		out = append(out, snapshotView(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s imageAPI) getSnapshot(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	sn, err := s.d.Snapshots().GetSnapshot(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotView(sn))
	return nil
}

func (s imageAPI) deleteSnapshot(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := s.d.Snapshots().DeleteSnapshot(r.Context(), owner(r, p), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type promoteRequest = wire.PromoteRequest

// promoteSnapshot makes a template of a snapshot. Templates are shared by
// every owner, so like an import it takes the admin key.
func (s imageAPI) promoteSnapshot(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may create templates")
	}
	var req promoteRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return errs.Field("name", "must be set")
	}
	t, err := s.d.Snapshots().TemplateFromSnapshot(r.Context(), owner(r, p), r.PathValue("id"), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, templateView(t))
	return nil
}

type forkRequest = wire.ForkRequest

func (s imageAPI) forkSandbox(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req forkRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	res, err := s.d.Checkpoints().Fork(r.Context(), owner(r, p), r.PathValue("id"), p.Owner, n)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, forkView(res))
	return nil
}
