package api

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
)

// maxCleanupBody bounds a clean-up request (a node takes at most a few
// hundred ids per request).
const maxCleanupBody = 64 << 10

// cleanupOrphans is POST /v1/reports/orphans/cleanup over the fleet: the
// request goes whole to every node, each judging against its own report
// what it holds (and refusing the rest as unknown to it). An item is
// deleted if a node deleted it; else its refusal is the most telling one
// (a node that holds it and says why, before "not found" from the
// others); not found anywhere while a node was silent, it is refused as
// unavailable naming those nodes.
func (r *Replica) cleanupOrphans(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	body, err := readBody(req, maxCleanupBody)
	if err != nil {
		return err
	}
	var in wire.OrphanCleanupRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return errs.Field("body", "must be a clean-up request (JSON): %v", err)
	}
	replies, missing, err := r.fanOutBody(req.Context(), req, body, p)
	if err != nil {
		return err
	}
	replies, refused := split(replies)
	if refused != nil {
		refused.write(w)
		return nil
	}
	deleted := map[wire.OrphanRef]bool{}
	why := map[wire.OrphanRef]wire.OrphanRefusal{}
	for _, rp := range replies {
		var res wire.OrphanCleanupResult
		if err := json.Unmarshal(rp.ans.body, &res); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		for _, d := range res.Deleted {
			deleted[d] = true
		}
		for _, f := range res.Refused {
			ref := wire.OrphanRef{Kind: f.Kind, ID: f.ID}
			if cur, ok := why[ref]; !ok || (cur.Error.Reason == errs.NotFound.String() && f.Error.Reason != errs.NotFound.String()) {
				why[ref] = f
			}
		}
	}
	out := wire.OrphanCleanupResult{Deleted: []wire.OrphanRef{}, Refused: []wire.OrphanRefusal{}}
	seen := map[wire.OrphanRef]bool{}
	one := func(ref wire.OrphanRef) {
		if seen[ref] {
			return
		}
		seen[ref] = true
		f, refusedHere := why[ref]
		switch {
		case deleted[ref]:
			out.Deleted = append(out.Deleted, ref)
		case (!refusedHere || f.Error.Reason == errs.NotFound.String()) && len(missing) > 0:
			out.Refused = append(out.Refused, wire.OrphanRefusal{Kind: ref.Kind, ID: ref.ID, Error: httpx.ErrorBody(
				errs.E(errs.Unavailable, "%s %s is on none of the nodes that answered; %s did not", ref.Kind, ref.ID, strings.Join(missing, ", ")))})
		case refusedHere:
			out.Refused = append(out.Refused, f)
		default:
			out.Refused = append(out.Refused, wire.OrphanRefusal{Kind: ref.Kind, ID: ref.ID,
				Error: httpx.ErrorBody(errs.E(errs.NotFound, "%s %s not found", ref.Kind, ref.ID))})
		}
	}
	for _, id := range in.Sandboxes {
		one(wire.OrphanRef{Kind: "sandbox", ID: id})
	}
	for _, id := range in.Snapshots {
		one(wire.OrphanRef{Kind: "snapshot", ID: id})
	}
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
	return nil
}
