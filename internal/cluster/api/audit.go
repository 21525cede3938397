package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
)

// auditMaxLimit is a node's own bound on one page (internal/server).
const auditMaxLimit = 1000

// The audit chain is each node's: a hash chain over that node's journal,
// its seq numbers that node's. With ?node= a request goes to that node
// whole (paging by after=, POST /v1/audit/verify). Without, GET /v1/audit
// asks every node for the page and merges the entries by time, oldest
// first, cut to the limit; such a page has no seq cursor (seqs of two
// chains do not compare), so it is paged by since= (the last entry's
// time) and after= is refused there naming node. A verify needs a node.
func (r *Replica) auditRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/audit", r.listAudit)
	r.handle(mux, "POST /v1/audit/verify", r.verifyAudit)
}

func (r *Replica) listAudit(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	q := req.URL.Query()
	if node := q.Get("node"); node != "" {
		return r.toNamedNode(w, req, p, node)
	}
	if q.Get("after") != "" {
		return errs.Field("after", "is one node's sequence number: name the node with ?node=, or page the merged chain with since=")
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditMaxLimit {
			return errs.Field("limit", "must be between 1 and %d, got %q", auditMaxLimit, v)
		}
		limit = n
	}
	replies, missing, err := r.fanOut(req.Context(), req, p)
	if err != nil {
		return err
	}
	replies, refused := split(replies)
	if refused != nil {
		refused.write(w)
		return nil
	}
	out := wire.AuditList{Entries: []wire.AuditEntry{}}
	for _, rp := range replies {
		var l wire.AuditList
		if err := json.Unmarshal(rp.ans.body, &l); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		out.Entries = append(out.Entries, l.Entries...)
	}
	slices.SortStableFunc(out.Entries, func(a, b wire.AuditEntry) int { return a.Time.Compare(b.Time) })
	if len(out.Entries) > limit {
		out.Entries = out.Entries[:limit]
	}
	slices.Sort(missing)
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (r *Replica) verifyAudit(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may verify the audit chain")
	}
	node := req.URL.Query().Get("node")
	if node == "" {
		return errs.Field("node", "must name the node whose audit chain to verify (each node keeps its own)")
	}
	return r.toNamedNode(w, req, p, node)
}

// toNamedNode sends req whole to node, which must be registered and
// alive, signed as the caller.
func (r *Replica) toNamedNode(w http.ResponseWriter, req *http.Request, p auth.Principal, node string) error {
	if _, err := r.builderNode(req.Context(), node); err != nil {
		return err
	}
	w.Header().Set(HeaderNode, node)
	r.proxyNode(w, req, node, req.URL.Path, &peer.Principal{Owner: p.Owner, Admin: p.Admin}, styleREST, nil)
	return nil
}
