package api

import (
	"net/http"
	"slices"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
)

// Credential leases live in the journal of the node that runs their
// sandbox (its egress proxy is what honours them). GET
// /v1/sandboxes/{id}/leases goes to that node like any sandbox request;
// the fleet-wide list asks every node as the caller (each node scopes it
// to the caller's owner, or the admin's ?owner=) and merges; a revoke is
// asked of every node, for a lease id names no sandbox: the one node that
// holds it revokes it, the others answer 404.
func (r *Replica) leaseRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/leases", r.listLeases)
	r.handle(mux, "DELETE /v1/leases/{id}", r.revokeLease)
}

// listLeases merges the nodes' lists, ordered by sandbox as one host
// orders them (then by generation and id, which one host leaves to its
// store's order).
func (r *Replica) listLeases(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	return serveMerged(r, w, req, p, func(parts []wire.LeaseList) wire.LeaseList {
		out := wire.LeaseList{Leases: []wire.Lease{}}
		for _, part := range parts {
			out.Leases = append(out.Leases, part.Leases...)
		}
		slices.SortStableFunc(out.Leases, func(a, b wire.Lease) int {
			if c := strings.Compare(a.SandboxID, b.SandboxID); c != 0 {
				return c
			}
			if a.Generation != b.Generation {
				return a.Generation - b.Generation
			}
			return strings.Compare(a.ID, b.ID)
		})
		return out
	})
}

// revokeLease sends the revoke to every node. The holder's answer (2xx)
// is sent on with Berth-Node naming it; no holder among the nodes that
// answered is the nodes' 404 when all answered, and 503 naming the
// silent ones otherwise (the lease may be on one of them, unrevoked).
func (r *Replica) revokeLease(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	id := req.PathValue("id")
	if !snapshotIDRe.MatchString(id) { // the same bound: leases' ids are shorter still
		return errs.E(errs.NotFound, "lease %s not found", id)
	}
	// ?sandbox= names the lease's sandbox (as GET /v1/sandboxes/{id}/leases
	// lists it): the revoke goes to that sandbox's node alone. The node
	// still checks that the lease is the caller's.
	if sbID := req.URL.Query().Get("sandbox"); sbID != "" {
		sb, err := r.visible(req, scope(req, p), sbID)
		if err != nil {
			return err
		}
		if n := sb.Attrs.Cluster.Node; n != "" {
			w.Header().Set(HeaderNode, n)
		}
		r.proxy(w, req, sb, &peer.Principal{Owner: p.Owner, Admin: p.Admin}, styleREST, nil)
		return nil
	}
	replies, missing, err := r.fanOut(req.Context(), req, p)
	if err != nil {
		return err
	}
	var refused *nodeAnswer
	for _, rp := range replies {
		a := rp.ans
		switch {
		case a.status >= 200 && a.status < 300:
			w.Header().Set(HeaderNode, rp.node)
			a.write(w)
			return nil
		case a.status != http.StatusNotFound && refused == nil:
			refused = a // e.g. 403: the request's fault, the same everywhere
		}
	}
	if refused != nil {
		refused.write(w)
		return nil
	}
	if len(missing) > 0 {
		setUnanswered(w, missing)
		return errs.E(errs.Unavailable, "lease %s is on none of the nodes that answered; %s did not (%s)", id, strings.Join(missing, ", "), HeaderUnanswered)
	}
	return errs.E(errs.NotFound, "lease %s not found", id)
}
