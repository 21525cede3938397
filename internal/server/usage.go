package server

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/quota"
)

// parseSince accepts an RFC 3339 time or a duration back from now ("24h", "7d").
func parseSince(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errs.Field("since", "must be an RFC 3339 time or a duration like 24h or 7d, got %q", v)
}

// usage serves GET /v1/usage: metered usage per owner and per sandbox, priced
// on both bases (reserved wall-clock vs active CPU and memory).
func (s adminAPI) usage(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	since, err := parseSince(q.Get("since"), s.d.Config().Now())
	if err != nil {
		return err
	}
	rep, err := s.d.Admission().Usage(r.Context(), owner(r, p), since, q.Get("sandbox"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, usageView(rep))
	return nil
}

// orphans serves GET /v1/reports/orphans?days=N.
func (s adminAPI) orphans(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	days := 7
	if v := r.URL.Query().Get("days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errs.Field("days", "must be a whole number of days, got %q", v)
		}
		days = n
	}
	rep, err := s.d.Admission().Orphans(r.Context(), owner(r, p), p.Admin, days)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orphanView(rep))
	return nil
}

// listQuotas: the admin sees every owner with limits; others their own.
func (s adminAPI) listQuotas(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		qi, err := s.d.Admission().Quota(r.Context(), p.Owner)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, []wire.QuotaInfo{quotaView(qi)})
		return nil
	}
	list, err := s.d.Admission().Quotas(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, quotaViews(list))
	return nil
}

func (s adminAPI) getQuota(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	o := r.PathValue("owner")
	if !p.Admin && o != p.Owner {
		return errs.E(errs.PermissionDenied, "only the admin key may read another owner's quota")
	}
	qi, err := s.d.Admission().Quota(r.Context(), o)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, quotaView(qi))
	return nil
}

func (s adminAPI) putQuota(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may set quotas")
	}
	var l wire.QuotaLimits
	if err := decode(r, &l); err != nil {
		return err
	}
	qi, err := s.d.Admission().SetQuota(r.Context(), r.PathValue("owner"), quota.Limits(l))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, quotaView(qi))
	return nil
}

func (s adminAPI) deleteQuota(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may remove quotas")
	}
	if err := s.d.Admission().DeleteQuota(r.Context(), r.PathValue("owner")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// metrics serves GET /metrics in the Prometheus text format. It needs the
// admin key (Prometheus: `authorization: {credentials_file: .../admin.key}`):
// owner names and usage are not for anonymous eyes.
func (s adminAPI) metrics(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "/metrics needs the admin key")
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	return s.d.WriteMetrics(r.Context(), w)
}

// clientRoute reports whether requests on a route make the caller a client
// of the sandbox for the reaper: everything under /v1/sandboxes/{id}/ except
// reading its events. Reading the sandbox's record does not count, so a
// dashboard polling `berth ls` keeps nothing awake.
func clientRoute(pattern string) bool {
	_, path, _ := strings.Cut(pattern, " ")
	// Reading the timeline (or following it) is not using the sandbox.
	return strings.HasPrefix(path, "/v1/sandboxes/{id}/") && path != "/v1/sandboxes/{id}/events" &&
		path != "/v1/sandboxes/{id}/activity"
}
