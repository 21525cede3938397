package e2b

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

const maxListLimit = 100

// listFilter translates the GET /v2/sandboxes query (§3.5).
func (s *Server) listFilter(owner string, q url.Values) (daemon.ListFilter, error) {
	return listFilterFor(owner, s.opts.BaseTemplate, q)
}

func listFilterFor(owner, baseTemplate string, q url.Values) (daemon.ListFilter, error) {
	f := daemon.ListFilter{Owner: owner, Limit: maxListLimit, Order: "desc"}
	var states []string
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st != "" {
				states = append(states, st)
			}
		}
	}
	if len(states) == 0 {
		states = []string{"running", "paused"}
	}
	for _, st := range states {
		switch st {
		case "running":
			f.States = append(f.States, sandbox.Creating, sandbox.Running, sandbox.Resuming)
		case "paused":
			f.States = append(f.States, sandbox.Pausing, sandbox.Paused)
		default:
			return f, errs.Field("state", "must be running or paused; got %q", st)
		}
	}
	md, err := decodeMetadataFilter(q.Get("metadata"))
	if err != nil {
		return f, err
	}
	f.Labels = md
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return f, errs.Field("startedAfter", "must be an RFC 3339 time; got %q", v)
		}
		f.CreatedAfter = t
	}
	if v := q.Get("template"); v != "" {
		if v == "base" {
			v = baseTemplate
		}
		f.Template = v
	}
	switch v := q.Get("order"); v {
	case "", "desc", "asc":
		if v != "" {
			f.Order = v
		}
	default:
		return f, errs.Field("order", "must be asc or desc; got %q", v)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, errs.Field("limit", "must be a positive integer; got %q", v)
		}
		f.Limit = min(n, maxListLimit)
	}
	f.Cursor = q.Get("nextToken")
	return f, nil
}

// handleList serves GET /v2/sandboxes: one page, X-Next-Token only when
// more results exist (the SDK's hasNext is "header present").
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	f, err := s.listFilter(ownerFrom(r.Context()), r.URL.Query())
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out, next, err := s.listPage(r, f)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleListV1 serves the 1.x GET /sandboxes: running sandboxes, no paging.
func (s *Server) handleListV1(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	q.Del("state")
	q.Set("state", "running")
	q.Del("nextToken")
	f, err := s.listFilter(ownerFrom(r.Context()), q)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	var all []detailJSON
	for {
		page, next, err := s.listPage(r, f)
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		f.Cursor = next
	}
	if all == nil {
		all = []detailJSON{}
	}
	writeJSON(w, http.StatusOK, all)
}

func (s *Server) listPage(r *http.Request, f daemon.ListFilter) ([]detailJSON, string, error) {
	sbs, next, err := s.d.List(r.Context(), f)
	if err != nil {
		return nil, "", err
	}
	out := make([]detailJSON, 0, len(sbs))
	for _, sb := range sbs {
		state, ok := e2bState(sb.State)
		if !ok {
			continue
		}
		out = append(out, s.toDetailJSON(sb, state, false, ""))
	}
	return out, next, nil
}
