package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
)

// ReasonLeaseExpired is the Node Ready condition's reason once its Lease
// ran out.
const ReasonLeaseExpired = "LeaseExpired"

// leaseGrace is how long a Node with no renewed Lease yet is left alone:
// its agent registers the Node before its first renewal.
const leaseGrace = 40 * time.Second

// Run runs the node-loss detector until ctx ends: every LossInterval it
// reads the Nodes and their Leases, marks a node whose Lease expired
// Ready=False (LeaseExpired) and moves its sandboxes to lost.
//
// Every replica runs it; there is no leader. Each write is conditional
// (the Node's status on its resourceVersion, each sandbox's transition on
// its object's) and idempotent (a node already marked is not written
// again; lost → lost is no transition), so two replicas seeing the same
// expiry write it once between them and a conflict is retried on the
// next tick. That costs a List of Nodes and Leases per replica per tick,
// cheaper than a leader election's own Lease renewals at this period.
func (r *Replica) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.LossInterval)
	defer t.Stop()
	defer r.nodes.close()
	var wg sync.WaitGroup
	defer wg.Wait() // before the node clients close
	wg.Go(func() { r.RunScheduler(ctx) })
	for {
		if err := r.DetectLoss(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("node-loss detector", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DetectLoss is one pass of the detector (Run's tick).
func (r *Replica) DetectLoss(ctx context.Context) error {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return err
	}
	r.nodes.put(nl.Items)
	leases, err := r.leases(ctx)
	if err != nil {
		return err
	}
	var errList []error
	named := map[string]bool{}
	for i := range nl.Items {
		n := &nl.Items[i]
		named[n.Name] = true
		now := r.now()
		lost, mark := lossDecision(n, leases[n.Name], leaseGrace, now)
		if !lost {
			continue
		}
		if mark {
			if err := r.markNodeLost(ctx, n, leases[n.Name], now); err != nil {
				errList = append(errList, err)
				continue
			}
		}
		if err := r.loseSandboxes(ctx, n.Name, now, fmt.Sprintf("node %s stopped renewing its lease", n.Name)); err != nil {
			errList = append(errList, err)
		}
	}
	// A Lease whose Node object is gone: an operator deleted the Node
	// (kubectl delete bnode X; the Lease is not the Node's to delete). A
	// live agent writes its Node again at its next renewal, so a fresh
	// Lease is left alone; once it has expired no one will, and the
	// node's sandboxes are lost as a lapsed node's are (without a Node,
	// nothing else would ever mark them).
	for _, name := range slices.Sorted(maps.Keys(leases)) {
		if named[name] {
			continue
		}
		now := r.now()
		if lost, _ := lossDecision(&berthv1.Node{ObjectMeta: kube.ObjectMeta{Name: name}}, leases[name], leaseGrace, now); !lost {
			continue
		}
		msg := fmt.Sprintf("node %s has no Node object and stopped renewing its lease", name)
		if err := r.loseSandboxes(ctx, name, now, msg); err != nil {
			errList = append(errList, err)
		}
	}
	if err := r.collectDeleted(ctx); err != nil {
		errList = append(errList, err)
	}
	return errors.Join(errList...)
}

func (r *Replica) markNodeLost(ctx context.Context, n *berthv1.Node, lease *kube.Lease, now time.Time) error {
	msg := "no Lease " + berthv1.NodeLeaseName(n.Name)
	if exp := leaseExpiry(lease); !exp.IsZero() {
		msg = fmt.Sprintf("Lease %s expired at %s", berthv1.NodeLeaseName(n.Name), exp.UTC().Format(time.RFC3339))
	}
	kube.SetCondition(&n.Status.Conditions, kube.Condition{Type: berthv1.CondNodeReady, Status: "False",
		LastTransitionTime: now.UTC().Truncate(time.Second), Reason: ReasonLeaseExpired, Message: msg})
	err := r.cfg.Kube.UpdateStatus(ctx, berthv1.Nodes, r.cfg.Namespace, n.Name, n, nil)
	if errs.Is(err, errs.Conflict) {
		return nil // the node renewed, or another replica marked it: next tick decides again
	}
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "mark node %s lost", n.Name)
	}
	r.log.Warn("node lost", "node", n.Name, "why", msg)
	r.metrics.markedLost("node", n.Name)
	return nil
}

// loseSandboxes moves every sandbox bound to node that is not lost or
// deleted yet to lost (reason node_lost, message msg), with its event.
func (r *Replica) loseSandboxes(ctx context.Context, node string, now time.Time, msg string) error {
	sbs, err := r.sandboxesOnNode(ctx, node)
	if err != nil {
		return err
	}
	var errList []error
	for _, sb := range sbs {
		if sb.State == sandbox.Lost || sb.State == sandbox.Deleted || sb.Attrs.Cluster.Node != node {
			continue
		}
		_, err := r.cfg.Store.Transition(ctx, sb.ID, sandbox.Lost,
			sandbox.Event{Actor: "scheduler", Reason: ReasonNodeLost, Message: msg, Time: now.UTC()},
			func(x *sandbox.Sandbox) error {
				if x.Attrs.Cluster.Node != node {
					return errs.E(errs.Conflict, "sandbox %s is no longer bound to %s", x.ID, node)
				}
				x.Reason, x.Message = ReasonNodeLost, msg
				x.Attrs.Cluster.LostAt = now.UTC()
				return nil
			})
		var te *sandbox.TransitionError
		switch {
		case err == nil:
			r.log.Warn("sandbox lost", "sandbox_id", sb.ID, "node", node, "owner", sb.Owner)
			r.metrics.markedLost("sandbox", node)
		case errors.As(err, &te), errs.Is(err, errs.NotFound), errs.Is(err, errs.Conflict):
			// Lost or deleted meanwhile (another replica, a delete): nothing to do.
		default:
			errList = append(errList, err)
		}
	}
	return errors.Join(errList...)
}
