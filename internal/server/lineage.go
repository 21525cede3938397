package server

import (
	"net/http"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/lineage"
)

// lineageAPI is the diff and compare group (internal/lineage).
type lineageAPI struct{ *Server }

// diff answers GET /v1/sandboxes/{id}/diff?against=&path=&stat=&max_text=.
func (s lineageAPI) diff(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	o := fsdiff.Options{Paths: q["path"]}
	if v := q.Get("stat"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errs.Field("stat", "must be true or false, got %q", v)
		}
		o.NoText = b
	}
	if v := q.Get("max_text"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errs.Field("max_text", "must be a byte count, got %q", v)
		}
		o.MaxTextBytes = n
	}
	res, err := s.d.Lineage().Diff(r.Context(), lineage.DiffRequest{Owner: owner(r, p), ID: r.PathValue("id"), Against: q.Get("against"), Options: o})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, diffView(res))
	return nil
}

// compare answers POST /v1/sandboxes/{id}/compare.
func (s lineageAPI) compare(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.CompareRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	timeout, err := ParseDuration(req.Timeout)
	if err != nil || timeout < 0 {
		return errs.Field("timeout", "must be a duration like 10m, got %q", req.Timeout)
	}
	id := r.PathValue("id")
	list, err := s.d.Lineage().Compare(r.Context(), lineage.CompareRequest{Owner: owner(r, p), ID: id, Check: req.Check, Timeout: timeout})
	if err != nil {
		return err
	}
	out := wire.CompareResult{Parent: id, Children: make([]wire.CompareChild, 0, len(list))}
	for _, c := range list {
		wc := wire.CompareChild{ID: c.ID, State: string(c.State), Error: c.Error}
		if c.Stat != nil {
			st := statView(*c.Stat)
			wc.Stat = &st
		}
		if c.Check != nil {
			wc.Check = &wire.CompareCheck{ExitCode: c.Check.ExitCode, Signal: c.Check.Signal, TimedOut: c.Check.TimedOut,
				Ms: c.Check.Ms, OutputTail: c.Check.OutputTail, Error: c.Check.Error}
		}
		if c.Cost != nil {
			wc.Cost = &wire.CompareCost{CPUSeconds: c.Cost.CPUSeconds, MemoryGiBSeconds: c.Cost.MemoryGiBSeconds,
				RunningSeconds: c.Cost.RunningSeconds, CostActive: c.Cost.CostActive, CostReserved: c.Cost.CostReserved}
		}
		out.Children = append(out.Children, wc)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func statView(s fsdiff.Stat) wire.DiffStat {
	return wire.DiffStat{Files: s.Files, Added: s.Added, Deleted: s.Deleted, Modified: s.Modified,
		LinesAdded: s.LinesAdded, LinesRemoved: s.LinesRemoved}
}

func nodeView(n *fsdiff.Node) *wire.DiffNode {
	if n == nil {
		return nil
	}
	return &wire.DiffNode{Type: string(n.Type), Mode: n.Mode, UID: n.UID, GID: n.GID, Size: n.Size, Target: n.Target, SHA256: n.SHA256}
}

func diffView(r *fsdiff.Result) wire.DiffResult {
	out := wire.DiffResult{Changes: make([]wire.DiffChange, 0, len(r.Changes)), Stat: statView(r.Stat)}
	for _, c := range r.Changes {
		out.Changes = append(out.Changes, wire.DiffChange{Path: c.Path, Kind: string(c.Kind), Old: nodeView(c.Old), New: nodeView(c.New),
			ContentChanged: c.ContentChanged, ModeChanged: c.ModeChanged, OwnerChanged: c.OwnerChanged, TypeChanged: c.TypeChanged,
			Binary: c.Binary, Refused: c.Refused, RenamedFrom: c.RenamedFrom, RenamedTo: c.RenamedTo,
			LinesAdded: c.LinesAdded, LinesRemoved: c.LinesRemoved, Unified: c.Unified, TextOmitted: c.TextOmitted})
	}
	return out
}
