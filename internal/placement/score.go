package placement

import (
	"slices"
	"time"
)

// cost is what placing req on n costs; lower is better. Its terms, each
// of order 1 (DefaultPolicy's weights say how they trade):
//
//   - warm: minus WarmBonus when a pool member of the template is taken,
//     minus CacheBonus when only the template's layers are there (a cold
//     start, but no layer fetch);
//   - drain: DrainWeight × how far the request moves the node's drain time
//     (the latest expected end of what runs there), as a share of the
//     request's own expected duration: 0 when it ends before the node
//     would drain anyway, 1 when it alone decides when the node drains;
//   - open: OpenWeight when nothing runs on the node (an empty node stays
//     whole for a request that needs one);
//   - fit: FitWeight × the node's memory left free after placing, as a share
//     of its capacity (best fit: fill the fullest node that takes it);
//   - spread: SpreadWeight × the owner's long sandboxes already on the node
//     (one lost node does not take all of one owner's long work).
func (p Policy) cost(req Request, class Class, expected time.Duration, n *Node, now time.Time) (c float64, warm, cache bool) {
	warm = warmMember(req, n) >= 0
	cache = warm || (req.Fingerprint != "" && slices.Contains(n.Cached, req.Fingerprint))
	switch {
	case warm:
		c -= p.WarmBonus
	case cache:
		c -= p.CacheBonus
	}
	if len(n.Running) == 0 {
		c += p.OpenWeight + p.DrainWeight
	} else {
		drain := now
		for _, r := range n.Running {
			if r.EndsAt.After(drain) {
				drain = r.EndsAt
			}
		}
		if ext := now.Add(expected).Sub(drain); ext > 0 && expected > 0 {
			c += p.DrainWeight * float64(ext) / float64(expected)
		}
	}
	if n.Capacity.MemoryMiB > 0 {
		left := n.Capacity.MemoryMiB - n.Allocated.MemoryMiB - req.Resources.MemoryMiB
		if warm {
			left += req.Resources.MemoryMiB
		}
		c += p.FitWeight * float64(left) / float64(n.Capacity.MemoryMiB)
		if left > 0 && left < p.LargeMiB {
			c += p.FragWeight
		}
	}
	if class == Long && req.Owner != "" {
		same := 0
		for _, r := range n.Running {
			if r.Class == Long && r.Owner == req.Owner {
				same++
			}
		}
		c += p.SpreadWeight * float64(same)
	}
	return c, warm, cache
}
