package api

import (
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/duration"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
)

// DefaultResources are what a node gives a sandbox that asks for nothing
// (internal/daemon's defaults): placement must charge what the node will
// actually allocate.
var DefaultResources = sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024}

// createSpec is what the replica needs of a create request, from the REST
// or the E2B body: enough to place it and to write its bound object.
type createSpec struct {
	Owner        string
	Template     string
	Runtime      string
	Resources    sandbox.Resources
	Labels       map[string]string
	TTL          time.Duration
	ExpiryAction sandbox.ExpiryAction
	Class        placement.Class
	Expected     time.Duration
}

// parseExpected reads expected_duration: a class name or a duration.
func parseExpected(field, s string) (placement.Class, time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", 0, nil
	}
	if c, err := placement.ParseClass(field, s); err == nil {
		return c, 0, nil
	}
	d, err := duration.Parse(s)
	if err != nil || d <= 0 {
		return "", 0, errs.Field(field, "must be a positive duration (45m, 2h) or short, interactive or long, got %q", s)
	}
	return "", d, nil
}

// withDefaults fills the resources a node fills.
func withDefaults(r sandbox.Resources) sandbox.Resources {
	if r.CPUMillis == 0 {
		r.CPUMillis = DefaultResources.CPUMillis
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = DefaultResources.MemoryMiB
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = DefaultResources.DiskMiB
	}
	if r.Pids == 0 {
		r.Pids = DefaultResources.Pids
	}
	return r
}

// placementRequest maps a create onto placement's request; fingerprint is
// the template's (cache and warm-pool locality).
func placementRequest(id string, spec createSpec, fingerprint string) placement.Request {
	r := withDefaults(spec.Resources)
	return placement.Request{
		ID:          id,
		Resources:   placement.Resources{CPUMillis: int64(r.CPUMillis), MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB},
		Runtime:     spec.Runtime,
		Fingerprint: fingerprint,
		Class:       spec.Class,
		Expected:    spec.Expected,
		Owner:       spec.Owner,
		Labels:      spec.Labels,
	}
}

// holds reports whether a sandbox in state st holds memory on its node.
// Stopped, failed, lost and deleted ones do not (a stopped sandbox keeps
// only its disk, which the node's own allocated figure counts).
func holds(st sandbox.State) bool {
	switch st {
	case sandbox.Creating, sandbox.Running, sandbox.Pausing, sandbox.Paused, sandbox.Resuming:
		return true
	case statePending: // bound by the scheduler, its node about to make it
		return true
	}
	return false
}

// nodeHealth says whether n may take work at now: its Ready condition is
// True, its Lease is fresh and it is not cordoned. lost is a node the
// detector marked (Ready False, LeaseExpired); expires is when its Lease
// runs out (zero without a Lease).
func nodeHealth(n *berthv1.Node, lease *kube.Lease, now time.Time) (ready, lost bool, expires time.Time) {
	c := kube.FindCondition(n.Status.Conditions, berthv1.CondNodeReady)
	lost = c != nil && c.Status == "False" && c.Reason == ReasonLeaseExpired
	expires = leaseExpiry(lease)
	fresh := !expires.IsZero() && now.Before(expires)
	ready = c != nil && c.Status == "True" && fresh && !n.Spec.Unschedulable
	return ready, lost, expires
}

// leaseExpiry is renewTime + leaseDurationSeconds (zero when the Lease is
// missing or was never renewed).
func leaseExpiry(l *kube.Lease) time.Time {
	if l == nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// placementNodes turns the Node objects, their Leases (by node name) and
// the sandboxes bound to each (by node name) into what Place reads.
// runtime is the request's ("" = any): a node's capabilities are those of
// that runtime, or of all its runtimes.
//
// Allocated memory and disk are the larger of what the node last reported
// and what the sandboxes bound to it hold: a sandbox another replica bound
// a moment ago is in the objects before it is in the node's report, so
// two creates in a row do not both see the node's last free gigabyte.
func placementNodes(nodes []berthv1.Node, leases map[string]*kube.Lease, bound map[string][]*sandbox.Sandbox,
	runtime string, poolShape sandbox.Resources, pol placement.Policy, now time.Time) []placement.Node {
	out := make([]placement.Node, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		ready, lost, expires := nodeHealth(n, leases[n.Name], now)
		pn := placement.Node{
			Name:         n.Name,
			Capacity:     resources(n.Status.Capacity),
			Allocated:    resources(n.Status.Allocated),
			Labels:       n.Labels,
			Cached:       n.Status.CachedTemplates,
			Ready:        ready,
			Lost:         lost,
			LeaseExpires: expires,
		}
		for _, rt := range n.Status.Runtimes {
			pn.Runtimes = append(pn.Runtimes, rt.Name)
			if runtime == "" || rt.Name == runtime {
				for _, c := range rt.Capabilities {
					if !slices.Contains(pn.Capabilities, c) {
						pn.Capabilities = append(pn.Capabilities, c)
					}
				}
			}
		}
		// A node reports ready members per fingerprint, not their shape:
		// members are made in the template's default shape, which is the
		// daemon's default resources unless a WarmPool says otherwise.
		for _, wp := range n.Status.WarmPools {
			pn.Pools = append(pn.Pools, placement.Pool{Fingerprint: wp.Fingerprint, Ready: int(wp.Ready),
				Each: placement.Resources{CPUMillis: int64(poolShape.CPUMillis), MemoryMiB: poolShape.MemoryMiB, DiskMiB: poolShape.DiskMiB}})
		}
		var held placement.Resources
		for _, sb := range bound[n.Name] {
			if !holds(sb.State) {
				continue
			}
			held = held.Add(placement.Resources{MemoryMiB: sb.Resources.MemoryMiB, DiskMiB: sb.Resources.DiskMiB})
			pn.Running = append(pn.Running, running(sb, pol, now))
		}
		pn.Allocated.MemoryMiB = max(pn.Allocated.MemoryMiB, held.MemoryMiB)
		pn.Allocated.DiskMiB = max(pn.Allocated.DiskMiB, held.DiskMiB)
		out = append(out, pn)
	}
	return out
}

// running is a bound sandbox as placement sees it: its class and expected
// end come from what placement was told when it was bound.
func running(sb *sandbox.Sandbox, pol placement.Policy, now time.Time) placement.Running {
	cl := sb.Attrs.Cluster
	class, _ := placement.ParseClass("duration_class", cl.DurationClass)
	exp, _ := time.ParseDuration(cl.ExpectedDuration)
	class, exp = pol.Expect(placement.Request{Class: class, Expected: exp})
	start := cl.BoundAt
	if start.IsZero() {
		start = sb.CreatedAt
	}
	end := start.Add(exp)
	if end.Before(now) {
		end = now // overdue: it ends any moment as far as anyone knows
	}
	return placement.Running{ID: sb.ID, Owner: sb.Owner, CPUMillis: int64(sb.Resources.CPUMillis),
		MemoryMiB: sb.Resources.MemoryMiB, Class: class, EndsAt: end}
}

func resources(r berthv1.Resources) placement.Resources {
	return placement.Resources{CPUMillis: r.CPUMillis, MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB}
}

// lossDecision is the node-loss detector's rule for one node: lost when
// its Lease is missing or expired (renewTime + leaseDurationSeconds ≤ now)
// and mark when the Node does not say so yet (Ready False, LeaseExpired).
// A node that never had a Lease but registered a moment ago gets grace
// (its agent creates the Node before its first renewal).
func lossDecision(n *berthv1.Node, lease *kube.Lease, grace time.Duration, now time.Time) (lost, mark bool) {
	exp := leaseExpiry(lease)
	if exp.IsZero() {
		born := time.Time{}
		if n.CreationTimestamp != nil {
			born = *n.CreationTimestamp
		}
		if lease != nil && lease.CreationTimestamp != nil && lease.CreationTimestamp.After(born) {
			born = *lease.CreationTimestamp
		}
		if born.IsZero() || now.Sub(born) < grace {
			return false, false
		}
	} else if now.Before(exp) {
		return false, false
	}
	c := kube.FindCondition(n.Status.Conditions, berthv1.CondNodeReady)
	return true, c == nil || c.Status != "False" || c.Reason != ReasonLeaseExpired
}
