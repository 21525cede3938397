package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/merges"
)

// mergeAPI is the handler group of merges and their conflicts (issue 18).
type mergeAPI struct{ *Server }

func mergeView(m merges.Merge) wire.Merge {
	out := wire.Merge{ID: m.ID, Target: m.Target, Source: m.Source, Base: m.Base, Strategy: string(m.Strategy),
		State: m.State, Writes: m.Writes, Deletes: m.Deletes, Conflicts: m.Conflicts, Ms: m.Ms, PhasesMs: m.Phases, Reason: m.Reason,
		CreatedAt: m.CreatedAt, OpenFiles: []wire.OpenFile{}}
	for _, f := range m.OpenFiles {
		out.OpenFiles = append(out.OpenFiles, wire.OpenFile{PID: f.PID, Cmd: f.Cmd, Path: f.Path})
	}
	return out
}

func conflictView(c merge.Conflict) wire.Conflict {
	v := func(x merge.Version) wire.ConflictVersion {
		return wire.ConflictVersion{Node: nodeView(x.Node), Text: x.Text}
	}
	return wire.Conflict{ID: c.ID, Path: c.Path, Kind: string(c.Kind), Message: c.Message,
		Base: v(c.Base), Ours: v(c.Ours), Theirs: v(c.Theirs), Merged: c.Merged}
}

func (s mergeAPI) startMerge(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.MergeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	m, err := s.d.Merges().Start(r.Context(), merges.Request{Owner: owner(r, p), Actor: p.Owner, Target: r.PathValue("id"),
		Source: req.Source, Strategy: req.Strategy, Paths: req.Paths})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, mergeView(m))
	return nil
}

func (s mergeAPI) listMerges(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	list, err := s.d.Merges().List(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]wire.Merge, 0, len(list))
	for _, m := range list {
		out = append(out, mergeView(m))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s mergeAPI) getMerge(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	m, err := s.d.Merges().Get(r.Context(), owner(r, p), r.PathValue("id"), r.PathValue("mid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, mergeView(m))
	return nil
}

func (s mergeAPI) abortMerge(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	m, err := s.d.Merges().Abort(r.Context(), owner(r, p), p.Owner, r.PathValue("id"), r.PathValue("mid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, mergeView(m))
	return nil
}

func (s mergeAPI) continueMerge(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	m, err := s.d.Merges().Continue(r.Context(), owner(r, p), p.Owner, r.PathValue("id"), r.PathValue("mid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, mergeView(m))
	return nil
}

func (s mergeAPI) listConflicts(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	_, cs, err := s.d.Merges().Conflicts(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]wire.Conflict, 0, len(cs))
	for _, c := range cs {
		out = append(out, conflictView(c))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s mergeAPI) resolveConflict(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.ResolveRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	m, err := s.d.Merges().Resolve(r.Context(), owner(r, p), p.Owner, r.PathValue("id"), r.PathValue("cid"),
		merge.Resolution{Side: merge.Side(req.Side), Content: req.Content, Mode: req.Mode})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, mergeView(m))
	return nil
}
