package api

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// queuePoll is how often a queued create reads its object while it waits.
const queuePoll = 200 * time.Millisecond

// queue is create's no-fit branch with --queue-wait: the request becomes a
// pending object (reason queued) and waits up to QueueWait for a scheduler
// (any replica's) to bind it. Bound, the object says creating and this
// replica forwards the client's request to the node, body as sent, so the
// sandbox is made from everything the client asked (network policy,
// secrets, E2B fields), not only what the object carries, and the answer
// is the node's create answer. Not bound in time (or the client leaves),
// the object is deleted and the answer is placement's refusal, as without
// a queue.
//
// A replica that dies while its request waits leaves a queued object: a
// scheduler still binds it, and its node makes it from the object after
// CreateGrace (node/decide.go), as for any create whose forward was lost.
func (r *Replica) queue(ctx context.Context, in *http.Request, body []byte, spec createSpec, fp string, p peer.Principal, refusal error) (*nodeAnswer, error) {
	id := sandbox.NewID()
	now := r.now().UTC()
	sb := &sandbox.Sandbox{
		ID: id, Owner: spec.Owner, Template: spec.Template, TemplateID: fp, Runtime: spec.Runtime,
		State: statePending, Reason: ReasonQueued, Message: errs.Short(refusal), Labels: spec.Labels,
		Resources: withDefaults(spec.Resources), CreatedAt: now, ExpiresAt: now.Add(spec.TTL), ExpiryAction: spec.ExpiryAction,
	}
	sb.Attrs.Cluster.DurationClass = string(spec.Class)
	if spec.Expected > 0 {
		sb.Attrs.Cluster.ExpectedDuration = spec.Expected.String()
	}
	if err := r.cfg.Store.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	log := r.log.With("sandbox_id", id, "owner", spec.Owner, "template", spec.Template)
	log.Info("create queued: no node has room", "why", sb.Message, "wait", r.cfg.QueueWait)
	r.kick()
	deadline := time.NewTimer(r.cfg.QueueWait)
	defer deadline.Stop()
	tick := time.NewTicker(queuePoll)
	defer tick.Stop()
	last := sb.Message
	timedOut := false
	for {
		cur, err := r.cfg.Store.GetSandbox(ctx, id)
		switch {
		case errs.Is(err, errs.NotFound):
			return nil, errs.E(errs.Conflict, "sandbox %s was deleted while its create waited in the queue", id)
		case err == nil && cur.Attrs.Cluster.Node != "":
			return r.forwardQueued(ctx, in, body, p, cur)
		case err == nil && cur.State == sandbox.Failed:
			r.dropQueued(ctx, id)
			return nil, errs.E(errs.FailedPrecondition, "queued create failed (%s): %s", cur.Reason, cur.Message)
		case err == nil:
			if cur.Message != "" {
				last = cur.Message
			}
		case ctx.Err() == nil:
			log.Warn("read a queued sandbox", "err", err) // the API server blinked: read again
		}
		if timedOut {
			r.dropQueued(ctx, id)
			return nil, errs.E(errs.ResourceExhausted, "%s (waited %s in the queue)", last, r.cfg.QueueWait)
		}
		select {
		case <-ctx.Done():
			r.dropQueued(ctx, id)
			return nil, errs.Wrap(errs.Unavailable, ctx.Err(), "the client left while its create waited in the queue")
		case <-deadline.C:
			timedOut = true // one last read: a bind that just landed wins
		case <-tick.C:
		}
	}
}

// forwardQueued sends the client's create to the node a scheduler bound
// the queued object to, as create does for a create that fitted at once.
func (r *Replica) forwardQueued(ctx context.Context, in *http.Request, body []byte, p peer.Principal, sb *sandbox.Sandbox) (*nodeAnswer, error) {
	node := sb.Attrs.Cluster.Node
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	ans, err := r.send(fctx, node, in, body, &p, sb.ID)
	cancel()
	if err == nil && ans.status/100 == 2 {
		r.log.Info("sandbox created from the queue", "sandbox_id", sb.ID, "node", node, "owner", sb.Owner,
			"template", sb.Template, "queued_for", r.now().Sub(sb.CreatedAt).Round(time.Millisecond))
		r.markStarted(ctx, sb.ID, ans)
		return ans, nil
	}
	// As in create: the node did not make it, so its object goes.
	r.dropQueued(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	return ans, nil
}

// dropQueued deletes a queued object no request waits on any more.
func (r *Replica) dropQueued(ctx context.Context, id string) {
	if err := r.cfg.Store.DeleteSandbox(context.WithoutCancel(ctx), id); err != nil && !errs.Is(err, errs.NotFound) {
		r.log.Warn("remove a queued sandbox's object", "sandbox_id", id, "err", err)
	}
}
