package api

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// quotaStore is kubestore's quota table: limits set through any replica
// are the cluster's, one row per owner.
type quotaStore interface {
	PutQuota(ctx context.Context, owner string, l quota.Limits) error
	GetQuota(ctx context.Context, owner string) (quota.Limits, error)
	ListQuotas(ctx context.Context) (map[string]quota.Limits, error)
	DeleteQuota(ctx context.Context, owner string) error
}

// Quotas on a replica are the store's rows, as on one host, with the use
// tallied over the cluster: sandboxes, CPU, memory and disk from the
// Sandbox objects (a lost sandbox holds nothing), snapshots counted on
// the nodes that hold them (a fan-out of GET /v1/snapshots; the nodes
// missing from the count are named in Berth-Unanswered-Nodes). A replica
// has no quota configuration: a source is "stored" or "none".
func (r *Replica) quotaRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/quotas", r.listQuotas)
	r.handle(mux, "GET /v1/quotas/{owner}", r.getQuota)
	r.handle(mux, "PUT /v1/quotas/{owner}", r.putQuota)
	r.handle(mux, "DELETE /v1/quotas/{owner}", r.deleteQuota)
}

func (r *Replica) quotas() (quotaStore, error) {
	qs, ok := r.cfg.Store.(quotaStore)
	if !ok {
		return nil, errs.E(errs.NotImplemented, "quotas: this replica's store keeps none")
	}
	return qs, nil
}

func (r *Replica) listQuotas(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	qs, err := r.quotas()
	if err != nil {
		return err
	}
	owners := []string{p.Owner}
	if p.Admin {
		stored, err := qs.ListQuotas(req.Context())
		if err != nil {
			return err
		}
		owners = slices.Sorted(maps.Keys(stored))
	}
	snaps, missing, err := r.snapshotCounts(req, p, "")
	if err != nil {
		return err
	}
	out := make([]wire.QuotaInfo, 0, len(owners))
	for _, o := range owners {
		qi, err := r.quotaInfo(req.Context(), qs, o, snaps[o])
		if err != nil {
			return err
		}
		out = append(out, qi)
	}
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (r *Replica) getQuota(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	o := req.PathValue("owner")
	if !p.Admin && o != p.Owner {
		return errs.E(errs.PermissionDenied, "only the admin key may read another owner's quota")
	}
	if err := auth.ValidOwner("owner", o); err != nil {
		return err
	}
	qs, err := r.quotas()
	if err != nil {
		return err
	}
	snaps, missing, err := r.snapshotCounts(req, p, o)
	if err != nil {
		return err
	}
	qi, err := r.quotaInfo(req.Context(), qs, o, snaps[o])
	if err != nil {
		return err
	}
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, qi)
	return nil
}

func (r *Replica) putQuota(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may set quotas")
	}
	o := req.PathValue("owner")
	if err := auth.ValidOwner("owner", o); err != nil {
		return err
	}
	var l wire.QuotaLimits
	if err := httpx.Decode(req, &l); err != nil {
		return err
	}
	if err := quota.Limits(l).Validate(""); err != nil {
		return err
	}
	qs, err := r.quotas()
	if err != nil {
		return err
	}
	if err := qs.PutQuota(req.Context(), o, quota.Limits(l)); err != nil {
		return err
	}
	return r.getQuota(w, req, p)
}

func (r *Replica) deleteQuota(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may remove quotas")
	}
	qs, err := r.quotas()
	if err != nil {
		return err
	}
	if err := qs.DeleteQuota(req.Context(), req.PathValue("owner")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// quotaInfo is owner's limits and use, snapshots counted by the caller.
func (r *Replica) quotaInfo(ctx context.Context, qs quotaStore, owner string, snapshots int) (wire.QuotaInfo, error) {
	qi := wire.QuotaInfo{Owner: owner, Source: "none"}
	l, err := qs.GetQuota(ctx, owner)
	switch {
	case err == nil:
		qi.Source, qi.Limits = "stored", wire.QuotaLimits(l)
	case !errs.Is(err, errs.NotFound):
		return qi, err
	}
	var held []*sandbox.Sandbox
	f := store.SandboxFilter{Owner: owner, Limit: 500}
	for {
		page, next, err := r.cfg.Store.ListSandboxes(ctx, f)
		if err != nil {
			return qi, err
		}
		for _, sb := range page {
			if sb.State != sandbox.Lost {
				held = append(held, sb)
			}
		}
		if next == "" {
			break
		}
		f.After = next
	}
	u := quota.Tally(held)
	u.Snapshots = snapshots
	qi.Use = wire.QuotaUse(u)
	return qi, nil
}

// snapshotCounts counts snapshots per owner on the nodes (owner "" =
// every owner the caller may see), asking GET /v1/snapshots as the caller.
func (r *Replica) snapshotCounts(in *http.Request, p auth.Principal, owner string) (map[string]int, []string, error) {
	q := url.Values{}
	if owner != "" {
		q.Set("owner", owner)
	}
	g := getRequest(in, "/v1/snapshots", q.Encode())
	replies, missing, err := r.fanOut(in.Context(), g, p)
	if errs.Is(err, errs.Unavailable) && len(replies) == 0 {
		// No node answered: the limits and the sandbox use still stand;
		// the count is named as missing.
		return map[string]int{}, missing, nil
	}
	if err != nil {
		return nil, nil, err
	}
	replies, refused := split(replies)
	if refused != nil {
		return nil, nil, errs.E(errs.Unavailable, "counting snapshots: a node answered %d: %s", refused.status, strings.TrimSpace(string(refused.body)))
	}
	out := map[string]int{}
	for _, rp := range replies {
		var list []wire.Snapshot
		if err := json.Unmarshal(rp.ans.body, &list); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		for _, sn := range list {
			out[sn.Owner]++
		}
	}
	slices.Sort(missing)
	return out, missing, nil
}

// getRequest is a body-less GET of path?query carrying in's context and
// headers (the fan-out strips the credentials and signs it).
func getRequest(in *http.Request, path, query string) *http.Request {
	g := in.Clone(in.Context())
	g.Method, g.Body, g.ContentLength = http.MethodGet, http.NoBody, 0
	g.URL.Path, g.URL.RawPath, g.URL.RawQuery = path, "", query
	return g
}

// setUnanswered names the nodes missing from an answer.
func setUnanswered(w http.ResponseWriter, missing []string) {
	if len(missing) > 0 {
		w.Header().Set(HeaderUnanswered, strings.Join(missing, ","))
	}
}

// checkQuota refuses a create that would take owner past its stored
// limits, counted over its Sandbox objects (every node's). Two replicas
// creating at once may both pass the last room: the limit is as soft as
// that race, by at most one create per replica.
func (r *Replica) checkQuota(ctx context.Context, spec createSpec) error {
	qs, ok := r.cfg.Store.(quotaStore)
	if !ok {
		return nil
	}
	l, err := qs.GetQuota(ctx, spec.Owner)
	if errs.Is(err, errs.NotFound) || (err == nil && l == (quota.Limits{})) {
		return nil
	}
	if err != nil {
		return err
	}
	qi, err := r.quotaInfo(ctx, qs, spec.Owner, 0)
	if err != nil {
		return err
	}
	return quota.Check(spec.Owner, l, quota.Use(qi.Use), withDefaults(spec.Resources))
}
