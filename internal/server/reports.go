package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/store"
)

// maxCleanup bounds one orphan clean-up request.
const maxCleanup = 200

// usageSeries serves GET /v1/usage/series?by=owner|template&step=1h&from=&to=:
// cost per bucket on both bases; an owner's key sees its own usage, the
// admin key every owner's (or ?owner=).
func (s adminAPI) usageSeries(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	now := s.d.Config().Now()
	sq := admission.SeriesQuery{By: q.Get("by")}
	if v := q.Get("step"); v != "" {
		d, err := ParseDuration(v)
		if err != nil {
			return errs.Field("step", "must be a duration of whole hours like 1h, 6h or 1d, got %q", v)
		}
		sq.Step = d
	}
	var err error
	if sq.From, err = parseTimeParam("from", q.Get("from"), now); err != nil {
		return err
	}
	if sq.To, err = parseTimeParam("to", q.Get("to"), now); err != nil {
		return err
	}
	ser, err := s.d.Admission().UsageSeries(r.Context(), owner(r, p), sq)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, seriesView(ser))
	return nil
}

// parseTimeParam is parseSince for a named parameter: an RFC 3339 time or a
// duration back from now.
func parseTimeParam(name, v string, now time.Time) (time.Time, error) {
	t, err := parseSince(v, now)
	if err != nil {
		return t, errs.Field(name, "must be an RFC 3339 time or a duration back from now like 24h or 7d, got %q", v)
	}
	return t, nil
}

// cleanupOrphans serves POST /v1/reports/orphans/cleanup: it deletes the
// named sandboxes and snapshots that are, when the request arrives, still
// orphans of the caller's report for the same days. Anything else (another
// owner's, active again, unknown) is refused with its reason and left alone.
func (s adminAPI) cleanupOrphans(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req wire.OrphanCleanupRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	days := 7
	if req.Days != nil {
		days = *req.Days
	}
	if n := len(req.Sandboxes) + len(req.Snapshots); n == 0 {
		return errs.Field("sandboxes", "name at least one sandbox or snapshot to clean up")
	} else if n > maxCleanup {
		return errs.Field("sandboxes", "at most %d sandboxes and snapshots per request, got %d", maxCleanup, n)
	}
	o := owner(r, p)
	rep, err := s.d.Admission().Orphans(r.Context(), o, p.Admin, days)
	if err != nil {
		return err
	}
	orphan := map[wire.OrphanRef]bool{}
	for _, it := range rep.Items {
		orphan[wire.OrphanRef{Kind: it.Kind, ID: it.ID}] = true
	}
	out := wire.OrphanCleanupResult{Deleted: []wire.OrphanRef{}, Refused: []wire.OrphanRefusal{}}
	done := map[wire.OrphanRef]bool{}
	do := func(ref wire.OrphanRef, visible func() error, del func() error) {
		if done[ref] {
			return
		}
		done[ref] = true
		err := visible()
		if err == nil && !orphan[ref] {
			err = errs.E(errs.FailedPrecondition, "%s %s is not an orphan of the last %d days (it was used since)", ref.Kind, ref.ID, days)
		}
		if err == nil {
			err = del()
		}
		if err != nil {
			if errs.KindOf(err) == errs.Internal {
				s.log.Error("orphan clean-up", "kind", ref.Kind, "id", ref.ID, "err", err)
			}
			out.Refused = append(out.Refused, wire.OrphanRefusal{Kind: ref.Kind, ID: ref.ID, Error: httpx.ErrorBody(err)})
			return
		}
		out.Deleted = append(out.Deleted, ref)
	}
	ctx := r.Context()
	for _, id := range req.Sandboxes {
		do(wire.OrphanRef{Kind: "sandbox", ID: id},
			func() error { _, err := s.d.Visible(ctx, o, id); return err },
			func() error { return s.d.Delete(ctx, o, id) })
	}
	for _, id := range req.Snapshots {
		do(wire.OrphanRef{Kind: "snapshot", ID: id},
			func() error { _, err := s.d.Snapshots().GetSnapshot(ctx, o, id); return err },
			func() error { return s.d.Snapshots().DeleteSnapshot(ctx, o, id) })
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// templateBuilds serves GET /v1/builds?template=NAME&limit=N: the build
// history (imports, pulls, Dockerfile builds), newest first. Templates are
// shared by every owner, and so is their history.
func (s imageAPI) templateBuilds(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a whole number >= 0, got %q", v)
		}
		limit = n
	}
	list, err := s.d.Templates().Builds(r.Context(), q.Get("template"), limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, buildsView(list))
	return nil
}

func seriesView(s admission.UsageSeries) wire.UsageSeries {
	out := wire.UsageSeries{By: s.By, StepSeconds: int64(s.Step / time.Second), From: s.From, To: s.To,
		Prices: wire.Prices(s.Prices), Buckets: s.Buckets, Lines: make([]wire.SeriesLine, 0, len(s.Lines))}
	for _, l := range s.Lines {
		out.Lines = append(out.Lines, wire.SeriesLine(l))
	}
	return out
}

func buildsView(list []store.TemplateBuild) wire.TemplateBuildList {
	out := wire.TemplateBuildList{Builds: make([]wire.TemplateBuild, 0, len(list))}
	for _, b := range list {
		out.Builds = append(out.Builds, wire.TemplateBuild{Seq: b.Seq, Template: b.Template, Kind: b.Kind, Source: b.Source,
			StartedAt: b.StartedAt, EndedAt: b.EndedAt, Millis: b.Duration().Milliseconds(), Result: b.Result,
			Fingerprint: b.Fingerprint, Layers: b.Layers, Error: b.Error})
	}
	return out
}
