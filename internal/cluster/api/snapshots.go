package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// snapshotIDRe bounds what a replica fans out as a snapshot id (the store's
// row ids are shorter still).
var snapshotIDRe = lazyregexp.New(`^[A-Za-z0-9_-]{1,64}$`)

// Snapshots are in the journal of the node that took them (POST
// /v1/sandboxes/{id}/snapshot goes to the sandbox's node like any
// sandbox request). The list asks every node; a request for one snapshot
// first asks every node which holds it (GET /v1/snapshots/{id} as the
// caller: the node's own scoping decides what the caller may see), then
// goes to that node. The source sandbox's object cannot stand in: the
// snapshot outlives it.
func (r *Replica) snapshotRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/snapshots", r.listSnapshots)
	r.handle(mux, "GET /v1/snapshots/{id}", r.getSnapshot)
	r.handle(mux, "DELETE /v1/snapshots/{id}", r.forwardSnapshot)
	r.handle(mux, "POST /v1/snapshots/{id}/template", r.forwardSnapshot)
}

func (r *Replica) listSnapshots(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	return serveMerged(r, w, req, p, func(parts []nodeSnapshots) nodeSnapshots {
		out := nodeSnapshots{}
		for _, part := range parts {
			out = append(out, part...)
		}
		slices.SortStableFunc(out, func(a, b wire.Snapshot) int {
			if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		return out
	})
}

// nodeSnapshots is one node's GET /v1/snapshots answer.
type nodeSnapshots []wire.Snapshot

func (r *Replica) getSnapshot(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	_, ans, err := r.locateSnapshot(req, p)
	if err != nil {
		return err
	}
	ans.write(w)
	return nil
}

func (r *Replica) forwardSnapshot(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	node, ans, err := r.locateSnapshot(req, p)
	if err != nil {
		return err
	}
	if ans.status < 200 || ans.status > 299 {
		ans.write(w) // not found (or not the caller's) where it was looked for
		return nil
	}
	w.Header().Set(HeaderNode, node)
	r.proxyNode(w, req, node, "snapshot "+req.PathValue("id"), &peer.Principal{Owner: p.Owner, Admin: p.Admin}, styleREST, nil)
	return nil
}

// locateSnapshot finds the node holding snapshot {id}: its name and its
// answer to the lookup. No node holding it is the nodes' refusal (404)
// when every node answered; with some silent, it is Unavailable naming
// them, for the snapshot may be on one of those.
func (r *Replica) locateSnapshot(req *http.Request, p auth.Principal) (string, *nodeAnswer, error) {
	id := req.PathValue("id")
	if !snapshotIDRe.MatchString(id) {
		return "", nil, errs.E(errs.NotFound, "snapshot %q not found", id)
	}
	q := url.Values{}
	if o := req.URL.Query().Get("owner"); o != "" && p.Admin {
		q.Set("owner", o)
	}
	replies, missing, err := r.fanOut(req.Context(), getRequest(req, "/v1/snapshots/"+id, q.Encode()), p)
	if err != nil {
		return "", nil, err
	}
	ok, refused := split(replies)
	if len(ok) > 0 {
		var sn wire.Snapshot
		if json.Unmarshal(ok[0].ans.body, &sn) != nil || sn.ID != id {
			return "", nil, errs.E(errs.Unavailable, "node %s answered for snapshot %s with another", ok[0].node, id)
		}
		return ok[0].node, ok[0].ans, nil
	}
	if len(missing) > 0 {
		return "", nil, errs.E(errs.Unavailable, "snapshot %s is on none of the nodes that answered; %s did not (%s)", id, strings.Join(missing, ", "), HeaderUnanswered)
	}
	return "", refused, nil
}
