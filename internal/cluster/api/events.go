package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// allEvents is GET /v1/events over the fleet: each node's feed (its own
// seq numbers) and the store's (what the replicas recorded: losses),
// merged by time, oldest first, cut to limit. As with the audit, after=
// is one node's sequence and needs ?node=, which sends the request to
// that node whole; the merged feed is paged by time.
func (r *Replica) allEvents(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	q := req.URL.Query()
	if node := q.Get("node"); node != "" {
		return r.toNamedNode(w, req, p, node)
	}
	if q.Get("after") != "" {
		return errs.Field("after", "is one node's event sequence number: name the node with ?node=")
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a non-negative integer")
		}
		limit = n
	}
	own, err := r.cfg.Store.ListEvents(req.Context(), store.EventFilter{Owner: scope(req, p), SandboxID: q.Get("sandbox"), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]wire.Event, 0, len(own))
	for _, e := range own {
		out = append(out, wire.Event{Seq: e.Seq, SandboxID: e.SandboxID, Owner: e.Owner, Time: e.Time, Actor: e.Actor,
			Type: e.Type, From: wire.State(e.From), To: wire.State(e.To), Reason: e.Reason, Message: e.Message, Data: e.Data})
	}
	replies, missing, err := r.fanOut(req.Context(), req, p)
	if err != nil && !errs.Is(err, errs.Unavailable) {
		return err
	}
	replies, refused := split(replies)
	if refused != nil {
		refused.write(w)
		return nil
	}
	for _, rp := range replies {
		var l []wire.Event
		if err := json.Unmarshal(rp.ans.body, &l); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		out = append(out, l...)
	}
	slices.SortStableFunc(out, func(a, b wire.Event) int { return a.Time.Compare(b.Time) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	slices.Sort(missing)
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
	return nil
}
