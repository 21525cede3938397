package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
)

// e2bMaxList is E2B's page bound (internal/e2b's maxListLimit).
const e2bMaxList = 100

// e2bListSnapshots is E2B's GET /snapshots over the fleet. The nodes are
// asked berth's GET /v1/snapshots (as the key's owner: E2B has no admin
// view), whose answer carries the creation time E2B's does not, so the
// replica orders and pages the union as one host does: newest first,
// nextToken the last id of the page.
func (r *Replica) e2bListSnapshots(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	q := req.URL.Query()
	limit := e2bMaxList
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeE2BError(w, errs.Field("limit", "must be a positive integer; got %q", v))
			return
		}
		limit = min(n, e2bMaxList)
	}
	replies, missing, err := r.fanOut(req.Context(), getRequest(req, "/v1/snapshots", ""), auth.Principal{Owner: p.Owner})
	if err != nil {
		writeE2BError(w, err)
		return
	}
	replies, refused := split(replies)
	if refused != nil {
		writeE2BError(w, errs.E(errs.Unavailable, "listing snapshots: a node answered %d", refused.status))
		return
	}
	sandboxID, name := q.Get("sandboxID"), q.Get("name")
	var all []wire.Snapshot
	for _, rp := range replies {
		var list []wire.Snapshot
		if err := json.Unmarshal(rp.ans.body, &list); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		for _, sn := range list {
			if (sandboxID == "" || sn.SourceSandbox == sandboxID) && (name == "" || sn.Name == name) {
				all = append(all, sn)
			}
		}
	}
	slices.SortFunc(all, func(a, b wire.Snapshot) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		i := slices.IndexFunc(all, func(sn wire.Snapshot) bool { return sn.ID == tok })
		if i < 0 {
			writeE2BError(w, errs.Field("nextToken", "unknown or expired token %q", tok))
			return
		}
		start = i + 1
	}
	end := min(start+limit, len(all))
	type snapshotJSON struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}
	out := make([]snapshotJSON, 0, end-start)
	for _, sn := range all[start:end] {
		j := snapshotJSON{SnapshotID: sn.ID, Names: []string{}}
		if sn.Name != "" {
			j.Names = append(j.Names, sn.Name)
		}
		out = append(out, j)
	}
	if end < len(all) {
		w.Header().Set("X-Next-Token", all[end-1].ID)
	}
	slices.Sort(missing)
	setUnanswered(w, missing)
	httpx.WriteJSON(w, http.StatusOK, out)
}

// e2bDeleteTemplate is E2B's DELETE /templates/{id}: on berth a
// "template" an E2B client deletes is a snapshot (by id or name), on one
// node only, so the delete itself is asked of every node: one that holds
// it deletes it (204), the others do not know it (404); a real template's
// delete is 501 on a node and so here.
func (r *Replica) e2bDeleteTemplate(w http.ResponseWriter, req *http.Request, p auth.Principal) {
	ref := req.PathValue("id")
	if ref == "" || len(ref) > 256 || strings.ContainsAny(ref, "/?#") {
		writeE2BError(w, errs.E(errs.NotFound, "snapshot %q not found", ref))
		return
	}
	replies, missing, err := r.fanOut(req.Context(), req, auth.Principal{Owner: p.Owner})
	if err != nil {
		writeE2BError(w, err)
		return
	}
	var notImpl, refused *nodeAnswer
	for _, rp := range replies {
		switch a := rp.ans; {
		case a.status >= 200 && a.status < 300:
			w.WriteHeader(http.StatusNoContent)
			return
		case a.status == http.StatusNotImplemented:
			notImpl = a
		case refused == nil:
			refused = a
		}
	}
	switch {
	case notImpl != nil:
		notImpl.write(w)
	case len(missing) > 0:
		writeE2BError(w, errs.E(errs.Unavailable, "snapshot %s is on none of the nodes that answered; %s did not", ref, strings.Join(missing, ", ")))
	default:
		refused.write(w)
	}
}
