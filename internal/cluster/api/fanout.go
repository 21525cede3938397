package api

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
)

// HeaderUnanswered names, comma-separated, the registered nodes whose
// part is missing from a merged answer: not alive (Ready not True or its
// Lease run out), past the per-node timeout, failed, or over the fan-out's
// node bound. A header rather than a body field: the body keeps the
// single-host shape (api/wire), so clients read it unchanged, and a client
// that cares checks one header.
const HeaderUnanswered = "Berth-Unanswered-Nodes"

// The bounds of a fan-out: how many nodes are asked (the rest, by name,
// are reported unanswered), how long each may take by default
// (Config.FanOutTimeout), and how many bytes of
// answers are read in all (split evenly among the nodes asked).
const (
	fanOutMaxNodes = 64
	fanOutTimeout  = 5 * time.Second
	fanOutMaxBytes = 32 << 20
)

// fanReply is one node's answer to a fan-out.
type fanReply struct {
	node string
	ans  *nodeAnswer
}

// fanOut sends a copy of in (no body) signed as p to every alive node at
// once and returns the answers that came, in node-name order, and the
// names of the nodes missing from them: not alive, over the node bound,
// failed to answer, or answered 5xx or 429 (a node's trouble, not the
// request's; 501 is an answer: the node does not do that). It is Unavailable when nodes were asked and none answered.
func (r *Replica) fanOut(ctx context.Context, in *http.Request, p auth.Principal) (replies []fanReply, missing []string, err error) {
	return r.fanOutBody(ctx, in, nil, p)
}

// fanOutBody is fanOut sending body (read and bounded by the caller) to
// each node.
func (r *Replica) fanOutBody(ctx context.Context, in *http.Request, body []byte, p auth.Principal) (replies []fanReply, missing []string, err error) {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return nil, nil, err
	}
	r.nodes.put(nl.Items)
	leases, err := r.leases(ctx)
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(nl.Items, func(a, b berthv1.Node) int { return strings.Compare(a.Name, b.Name) })
	var ask []string
	for i := range nl.Items {
		n := &nl.Items[i]
		if !r.alive(n, leases[n.Name]) || len(ask) == fanOutMaxNodes {
			missing = append(missing, n.Name)
			continue
		}
		ask = append(ask, n.Name)
	}
	if len(ask) == 0 {
		return nil, missing, nil
	}
	limit := int64(fanOutMaxBytes / len(ask))
	pp := peer.Principal{Owner: p.Owner, Admin: p.Admin}
	answers := make([]*nodeAnswer, len(ask))
	errsBy := make([]error, len(ask))
	var wg sync.WaitGroup
	for i, node := range ask {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, r.cfg.FanOutTimeout)
			defer cancel()
			answers[i], errsBy[i] = r.sendLimit(nctx, node, in, body, &pp, "", limit)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, nil, errs.Wrap(errs.Unavailable, ctx.Err(), "fan-out to the nodes")
	}
	for i, node := range ask {
		a := answers[i]
		switch {
		case errsBy[i] != nil:
			r.log.WarnContext(ctx, "node did not answer a fan-out", "node", node, "path", in.URL.Path, "err", errsBy[i])
			missing = append(missing, node)
		case (a.status >= 500 && a.status != http.StatusNotImplemented) || a.status == http.StatusTooManyRequests:
			r.log.WarnContext(ctx, "node failed a fan-out", "node", node, "path", in.URL.Path, "status", a.status)
			missing = append(missing, node)
		default:
			replies = append(replies, fanReply{node: node, ans: a})
		}
	}
	slices.Sort(missing)
	if len(replies) == 0 {
		return nil, missing, errs.E(errs.Unavailable, "no node answered %s %s (asked %s)", in.Method, in.URL.Path, strings.Join(ask, ", "))
	}
	return replies, missing, nil
}

// alive: the node's agent is running (Ready True, Lease fresh). A
// cordoned node takes no new sandboxes but still holds usage, snapshots
// and history: alive is enough to be asked.
func (r *Replica) alive(n *berthv1.Node, lease *kube.Lease) bool {
	c := kube.FindCondition(n.Status.Conditions, berthv1.CondNodeReady)
	exp := leaseExpiry(lease)
	return c != nil && c.Status == "True" && !exp.IsZero() && r.now().Before(exp)
}

// split sorts fan-out answers into the 2xx ones and the first refusal
// (4xx): a refusal is the request's fault, the same on every node, and is
// sent on as the answer.
func split(replies []fanReply) (ok []fanReply, refused *nodeAnswer) {
	for _, rp := range replies {
		if rp.ans.status >= 200 && rp.ans.status < 300 {
			ok = append(ok, rp)
		} else if refused == nil {
			refused = rp.ans
		}
	}
	return ok, refused
}

// serveMerged fans in out, decodes each node's answer as T, merges them
// with merge and writes the result, naming the missing nodes in
// HeaderUnanswered.
func serveMerged[T any](r *Replica, w http.ResponseWriter, in *http.Request, p auth.Principal, merge func([]T) T) error {
	replies, missing, err := r.fanOut(in.Context(), in, p)
	if err != nil {
		return err
	}
	replies, refused := split(replies)
	if refused != nil {
		refused.write(w)
		return nil
	}
	parts := make([]T, 0, len(replies))
	for _, rp := range replies {
		var v T
		if err := json.Unmarshal(rp.ans.body, &v); err != nil {
			// A node speaking another shape (another version) is one
			// that did not answer, not a failed request.
			r.log.WarnContext(in.Context(), "node answer not understood", "node", rp.node, "path", in.URL.Path, "err", err)
			missing = append(missing, rp.node)
			continue
		}
		parts = append(parts, v)
	}
	slices.Sort(missing)
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, merge(parts))
	return nil
}

func (r *Replica) usage(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	return serveMerged(r, w, req, p, mergeUsage)
}

func (r *Replica) orphans(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	return serveMerged(r, w, req, p, mergeOrphans)
}

// mergeUsage joins the nodes' usage reports: the sandbox lines side by
// side (a sandbox is metered where it ran; one that moved, e.g. forked
// elsewhere, has a line per node, summed), the owner lines summed, the
// peak the largest node's (a lower bound of the fleet-wide peak), the
// average recomputed from the sums. Prices and since are the first
// node's: the nodes of one cluster share their configuration.
func mergeUsage(parts []wire.UsageReport) wire.UsageReport {
	out := wire.UsageReport{Owners: []wire.UsageLine{}, Sandboxes: []wire.UsageLine{}}
	if len(parts) > 0 {
		out.Since, out.Prices = parts[0].Since, parts[0].Prices
	}
	sbs := map[string]wire.UsageLine{}
	owners := map[string]wire.UsageLine{}
	for _, part := range parts {
		for _, l := range part.Sandboxes {
			cur, ok := sbs[l.SandboxID]
			if !ok {
				sbs[l.SandboxID] = l
				continue
			}
			sbs[l.SandboxID] = addUsage(cur, l)
		}
		for _, l := range part.Owners {
			cur, ok := owners[l.Owner]
			if !ok {
				owners[l.Owner] = l
				continue
			}
			cur = addUsage(cur, l)
			cur.Sandboxes += l.Sandboxes
			owners[l.Owner] = cur
		}
	}
	for _, id := range slices.Sorted(maps.Keys(sbs)) {
		out.Sandboxes = append(out.Sandboxes, sbs[id])
	}
	for _, o := range slices.Sorted(maps.Keys(owners)) {
		l := owners[o]
		if t := l.RunningSeconds + l.FrozenSeconds; t > 0 {
			l.MemAvgMiB = l.MemGiBSeconds / t * 1024
		}
		out.Owners = append(out.Owners, l)
	}
	return out
}

// addUsage sums b into a (the metered figures; identity fields are a's).
func addUsage(a, b wire.UsageLine) wire.UsageLine {
	a.CPUSeconds += b.CPUSeconds
	a.MemGiBSeconds += b.MemGiBSeconds
	a.MemPeakMiB = max(a.MemPeakMiB, b.MemPeakMiB)
	a.RunningSeconds += b.RunningSeconds
	a.FrozenSeconds += b.FrozenSeconds
	a.PausedSeconds += b.PausedSeconds
	a.StoppedSeconds += b.StoppedSeconds
	a.DiskGiBHours += b.DiskGiBHours
	a.CostReserved += b.CostReserved
	a.CostActive += b.CostActive
	if b.LastActiveAt.After(a.LastActiveAt) {
		a.LastActiveAt = b.LastActiveAt
	}
	if t := a.RunningSeconds + a.FrozenSeconds; t > 0 {
		a.MemAvgMiB = a.MemGiBSeconds / t * 1024
	}
	return a
}

// mergeOrphans joins the nodes' orphan reports; a template every node
// holds is reported once (the first node's line), ordered by idle days,
// longest first.
func mergeOrphans(parts []wire.OrphanReport) wire.OrphanReport {
	out := wire.OrphanReport{Items: []wire.Orphan{}}
	if len(parts) > 0 {
		out.Days = parts[0].Days
	}
	seen := map[string]bool{}
	for _, part := range parts {
		for _, o := range part.Items {
			k := o.Kind + "/" + o.ID
			if seen[k] {
				continue
			}
			seen[k] = true
			out.Items = append(out.Items, o)
		}
	}
	slices.SortStableFunc(out.Items, func(a, b wire.Orphan) int {
		switch {
		case a.IdleDays > b.IdleDays:
			return -1
		case a.IdleDays < b.IdleDays:
			return 1
		}
		return strings.Compare(a.Kind+"/"+a.ID, b.Kind+"/"+b.ID)
	})
	return out
}

func (r *Replica) usageSeries(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	return serveMerged(r, w, req, p, mergeSeries)
}

// mergeSeries sums the nodes' cost series per key and bucket. The buckets
// are the first node's; another node's bucket is matched by its time (a
// node that computed its window across an hour boundary has one bucket
// more at one end: that one is left out, and its cost from the totals).
func mergeSeries(parts []wire.UsageSeries) wire.UsageSeries {
	if len(parts) == 0 {
		return wire.UsageSeries{Buckets: []time.Time{}, Lines: []wire.SeriesLine{}}
	}
	out := parts[0]
	out.Lines = []wire.SeriesLine{}
	if out.Buckets == nil {
		out.Buckets = []time.Time{}
	}
	at := map[int64]int{}
	for i, b := range out.Buckets {
		at[b.UnixNano()] = i
	}
	n := len(out.Buckets)
	lines := map[string]*wire.SeriesLine{}
	for _, part := range parts {
		for _, l := range part.Lines {
			m := lines[l.Key]
			if m == nil {
				m = &wire.SeriesLine{Key: l.Key, Reserved: make([]float64, n), Active: make([]float64, n)}
				lines[l.Key] = m
			}
			for j, b := range part.Buckets {
				i, ok := at[b.UnixNano()]
				if !ok || j >= len(l.Reserved) || j >= len(l.Active) {
					continue
				}
				m.Reserved[i] += l.Reserved[j]
				m.Active[i] += l.Active[j]
				m.TotalReserved += l.Reserved[j]
				m.TotalActive += l.Active[j]
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(lines)) {
		out.Lines = append(out.Lines, *lines[k])
	}
	return out
}
