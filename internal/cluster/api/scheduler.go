package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
)

// statePending is an unbound Sandbox object's state: a create queued by a
// replica (--queue-wait) or an object a person applied with kubectl.
const statePending = sandbox.State(berthv1.StatePending)

// Reasons the scheduler writes.
const (
	// ReasonQueued marks a pending object a replica's create request
	// waits on: bound, it becomes creating and that replica forwards the
	// request (the node waits CreateGrace for it). Any other pending
	// object stays pending when bound, and its node makes it at once.
	ReasonQueued = "queued"
	// ReasonInvalidSpec fails an object whose spec cannot be run; the
	// message names the field.
	ReasonInvalidSpec = "invalid_spec"
	// ReasonExpired fails a pending object whose expiry passed unbound.
	ReasonExpired = "expired"
)

// maxBindsPerPass bounds one pass's work (each object is one placement,
// which lists the fleet): the rest wait for the next tick.
const maxBindsPerPass = 64

// errSkip aborts a conditional write whose precondition no longer holds
// (another replica bound the object, or it changed state).
var errSkip = errors.New("skip")

// RunScheduler binds pending Sandbox objects to nodes until ctx ends:
// every ScheduleInterval, and at once when woken (a queued create, a
// delete that frees room).
//
// Every replica runs it and there is no leader: each bind is the store's
// conditional PUT on the object's resourceVersion, and the write function
// refuses an object that is bound already, so when two replicas pick the
// same object one writes and the other, on its Conflict, re-reads it and
// leaves it be.
func (r *Replica) RunScheduler(ctx context.Context) {
	t := time.NewTicker(r.cfg.ScheduleInterval)
	defer t.Stop()
	for {
		if err := r.Schedule(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("scheduler", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.wake:
		}
	}
}

// kick wakes the scheduler (never blocks).
func (r *Replica) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Schedule is one pass: the unbound pending objects, oldest first, each
// validated, placed and bound, or told why not.
//
// A younger object that fits is bound even while an older, larger one
// waits: nothing is evicted and nothing is reserved, so holding the queue
// for the head would leave room idle until some sandbox ends.
func (r *Replica) Schedule(ctx context.Context) error {
	var errList []error
	if err := r.unbindFromLost(ctx); err != nil { // first: this pass places them again
		errList = append(errList, err)
	}
	var l berthv1.SandboxList
	if err := r.cfg.Kube.List(ctx, berthv1.Sandboxes, r.cfg.Namespace,
		kube.ListOptions{LabelSelector: "!" + berthv1.LabelNode}, &l); err != nil {
		return errors.Join(append(errList, err)...)
	}
	var pending []*berthv1.Sandbox
	for i := range l.Items {
		o := &l.Items[i]
		if o.Status.State != "" && o.Status.State != berthv1.StatePending {
			continue
		}
		if o.Spec.NodeName != "" {
			// A name with no node label: written by hand (the store sets
			// both), and no node would ever see it (they select by label).
			if err := r.failRaw(ctx, o, "spec.nodeName: is set by berth's scheduler; leave it empty"); err != nil {
				errList = append(errList, err)
			}
			continue
		}
		pending = append(pending, o)
	}
	slices.SortFunc(pending, func(a, b *berthv1.Sandbox) int {
		return cmpCreated(created(a), a.Name, created(b), b.Name)
	})
	for i, o := range pending {
		if i == maxBindsPerPass {
			break
		}
		if err := r.scheduleOne(ctx, o); err != nil && !errs.Is(err, errs.NotFound) {
			errList = append(errList, fmt.Errorf("sandbox %s: %w", o.Name, err))
		}
	}
	return errors.Join(errList...)
}

func created(o *berthv1.Sandbox) time.Time {
	if t := o.Status.Timings.CreatedAt; t != nil {
		return *t
	}
	if o.CreationTimestamp != nil {
		return *o.CreationTimestamp
	}
	return time.Time{}
}

func cmpCreated(t1 time.Time, id1 string, t2 time.Time, id2 string) int {
	if c := t1.Compare(t2); c != 0 {
		return c
	}
	return strings.Compare(id1, id2)
}

// scheduleOne validates, places and binds one pending object.
func (r *Replica) scheduleOne(ctx context.Context, o *berthv1.Sandbox) error {
	if !sandbox.ValidID(o.Name) {
		// The store cannot address it (an id is what a node makes it
		// under): failed on the object itself.
		return r.failRaw(ctx, o, fmt.Sprintf("metadata.name: a sandbox's name must be 1-64 lowercase letters and digits, got %q", o.Name))
	}
	sb, err := kubestore.SandboxFromObject(o)
	if err != nil { // a person wrote berth's annotation, badly: the store cannot read it either
		return r.failRaw(ctx, o, "metadata.annotations: "+errs.Short(err))
	}
	now := r.now().UTC()
	if !sb.ExpiresAt.IsZero() && !now.Before(sb.ExpiresAt) {
		return r.failPending(ctx, sb.ID, ReasonExpired, "it expired at "+sb.ExpiresAt.Format(time.RFC3339)+" before any node had room for it")
	}
	spec, fp, err := r.pendingSpec(ctx, o, sb)
	if err != nil {
		if f := errs.FieldOf(err); f != "" || errs.Is(err, errs.InvalidArgument) {
			return r.failPending(ctx, sb.ID, ReasonInvalidSpec, err.Error())
		}
		if errs.Is(err, errs.FailedPrecondition) { // template not ready yet: wait
			return r.unschedulable(ctx, sb, err.Error())
		}
		return err
	}
	dec, err := r.place(ctx, spec, fp, nil)
	if errs.Is(err, errs.ResourceExhausted) {
		return r.unschedulable(ctx, sb, errs.Short(err))
	}
	if err != nil {
		return err
	}
	return r.bind(ctx, sb.ID, dec, fp, spec)
}

// pendingSpec reads what placement needs from a pending object, checking
// what a person may have written wrong (a replica's own queued objects
// pass, having been checked at the request). The fields are named as in
// the object (spec.template), since that is what the person wrote.
func (r *Replica) pendingSpec(ctx context.Context, o *berthv1.Sandbox, sb *sandbox.Sandbox) (createSpec, string, error) {
	if err := auth.ValidOwner("spec.owner", sb.Owner); err != nil {
		return createSpec{}, "", err
	}
	if o.Spec.Network != nil {
		// The object cannot carry a policy to the node without loss
		// (kubestore keeps egress's own form in the sandbox's attributes):
		// refused rather than run with another policy than asked.
		return createSpec{}, "", errs.Field("spec.network", "is not supported on a Sandbox object yet; create the sandbox through the API (POST /v1/sandboxes) to give it a network policy")
	}
	name := sb.Template
	if name == "" {
		name = r.cfg.DefaultTemplate
	}
	tpl, err := r.cfg.Store.GetTemplate(ctx, name)
	if errs.Is(err, errs.NotFound) {
		return createSpec{}, "", errs.Field("spec.template", "unknown template %q (see `berth template ls`)", name)
	}
	if err != nil {
		return createSpec{}, "", err
	}
	switch tpl.State {
	case "", "ready":
	case "failed":
		return createSpec{}, "", errs.Field("spec.template", "template %q failed to build", name)
	default:
		return createSpec{}, "", errs.E(errs.FailedPrecondition, "template %q is %s, not ready", name, tpl.State)
	}
	if err := sandbox.ValidateResources(sb.Resources, sandbox.Resources{}); err != nil {
		return createSpec{}, "", errs.ReclassifyField("spec.resources", err, "%s", errs.Short(err))
	}
	if err := sandbox.ValidateLabels("spec.labels", sb.Labels); err != nil {
		return createSpec{}, "", err
	}
	switch sb.ExpiryAction {
	case "", sandbox.ExpireStop, sandbox.ExpirePause, sandbox.ExpireDelete:
	default:
		return createSpec{}, "", errs.Field("spec.expiryAction", "must be stop, pause or delete, got %q", sb.ExpiryAction)
	}
	spec := createSpec{Owner: sb.Owner, Template: name, Runtime: sb.Runtime, Resources: sb.Resources, Labels: sb.Labels,
		ExpiryAction: sb.ExpiryAction}
	cl := sb.Attrs.Cluster
	if cl.DurationClass != "" {
		if spec.Class, err = placement.ParseClass("spec.durationClass", cl.DurationClass); err != nil {
			return createSpec{}, "", err
		}
	}
	if cl.ExpectedDuration != "" {
		d, err := time.ParseDuration(cl.ExpectedDuration)
		if err != nil || d < 0 {
			return createSpec{}, "", errs.Field("spec.expectedDuration", "must be a Go duration (90s, 1h30m), got %q", cl.ExpectedDuration)
		}
		spec.Expected = d
	}
	return spec, tpl.Fingerprint, nil
}

// bind writes the decision into the object if it is still pending and
// unbound (the store's conditional PUT; on a Conflict it re-reads, and an
// object another replica bound meanwhile is left alone).
func (r *Replica) bind(ctx context.Context, id string, dec placement.Decision, fp string, spec createSpec) error {
	now := r.now().UTC()
	var queued bool
	_, err := r.cfg.Store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		if sb.State != statePending || sb.Attrs.Cluster.Node != "" {
			return errSkip
		}
		queued = sb.Reason == ReasonQueued
		if queued {
			sb.State = sandbox.Creating
		}
		sb.Reason, sb.Message = "", ""
		sb.Template, sb.TemplateID = spec.Template, fp
		sb.Resources = withDefaults(sb.Resources)
		if sb.ExpiresAt.IsZero() {
			sb.ExpiresAt = now.Add(r.cfg.DefaultTTL) // every sandbox has an expiry
		}
		sb.Attrs.Cluster = sandbox.ClusterState{Node: dec.Node, ExpectedDuration: dec.Expected.String(),
			DurationClass: string(dec.Class), BoundAt: now}
		return nil
	})
	if errors.Is(err, errSkip) {
		return nil
	}
	if err != nil {
		return err
	}
	r.log.Info("sandbox scheduled", "sandbox_id", id, "node", dec.Node, "owner", spec.Owner, "template", spec.Template,
		"class", dec.Class, "expected", dec.Expected, "queued", queued)
	return nil
}

// unschedulable records why nothing fits, only when that changed: a pass
// that finds the same answer writes nothing.
func (r *Replica) unschedulable(ctx context.Context, sb *sandbox.Sandbox, msg string) error {
	if sb.Message == msg && sb.Version > 0 {
		return nil
	}
	_, err := r.cfg.Store.UpdateSandbox(ctx, sb.ID, func(x *sandbox.Sandbox) error {
		if x.State != statePending || x.Attrs.Cluster.Node != "" || (x.Message == msg && x.Version > 0) {
			return errSkip
		}
		x.Message = msg
		return nil
	})
	if errors.Is(err, errSkip) {
		return nil
	}
	if err == nil {
		r.log.Info("sandbox unschedulable", "sandbox_id", sb.ID, "owner", sb.Owner, "why", msg)
	}
	return err
}

// failPending fails a pending unbound object (no transition in
// internal/sandbox's table leaves pending: the scheduler owns this step).
func (r *Replica) failPending(ctx context.Context, id, reason, msg string) error {
	_, err := r.cfg.Store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		if sb.State != statePending || sb.Attrs.Cluster.Node != "" {
			return errSkip
		}
		sb.State, sb.Reason, sb.Message = sandbox.Failed, reason, msg
		return nil
	})
	if errors.Is(err, errSkip) {
		return nil
	}
	if err == nil {
		r.log.Warn("pending sandbox failed", "sandbox_id", id, "reason", reason, "why", msg)
	}
	return err
}

// failRaw fails an object the store cannot read as a sandbox, on its
// resourceVersion (a Conflict leaves it to the next pass).
func (r *Replica) failRaw(ctx context.Context, o *berthv1.Sandbox, msg string) error {
	o.Status.State, o.Status.Reason = string(sandbox.Failed), ReasonInvalidSpec
	t := r.now().UTC().Truncate(time.Second)
	kube.SetCondition(&o.Status.Conditions, kube.Condition{Type: berthv1.CondScheduled, Status: "False",
		Reason: "InvalidSpec", Message: msg, LastTransitionTime: t})
	kube.SetCondition(&o.Status.Conditions, kube.Condition{Type: berthv1.CondReady, Status: "False",
		Reason: "Failed", Message: msg, LastTransitionTime: t})
	err := r.cfg.Kube.Update(ctx, berthv1.Sandboxes, r.cfg.Namespace, o.Name, o, nil)
	if errs.Is(err, errs.Conflict) {
		return nil
	}
	if err == nil {
		r.log.Warn("sandbox object failed", "object", o.Name, "why", msg)
	}
	return err
}

// unbindFromLost frees the objects bound to a node that was lost (or whose
// Node is gone) before it made them: still pending, they never ran, so
// "lost is final" does not apply, and the next pass places them anew. The
// node, should it come back, no longer sees them as its own and removes
// whatever it had begun (node/decide.go: a local sandbox with no object).
func (r *Replica) unbindFromLost(ctx context.Context) error {
	var l berthv1.SandboxList
	if err := r.cfg.Kube.List(ctx, berthv1.Sandboxes, r.cfg.Namespace,
		kube.ListOptions{LabelSelector: berthv1.LabelState + "=" + berthv1.StatePending + "," + berthv1.LabelNode}, &l); err != nil {
		return err
	}
	if len(l.Items) == 0 {
		return nil
	}
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return err
	}
	leases, err := r.leases(ctx)
	if err != nil {
		return err
	}
	gone := map[string]bool{}
	known := map[string]bool{}
	for i := range nl.Items {
		n := &nl.Items[i]
		known[n.Name] = true
		if _, lost, _ := nodeHealth(n, leases[n.Name], r.now()); lost {
			gone[n.Name] = true
		}
	}
	var errList []error
	for i := range l.Items {
		node := l.Items[i].Spec.NodeName
		if node == "" || (known[node] && !gone[node]) {
			continue
		}
		_, err := r.cfg.Store.UpdateSandbox(ctx, l.Items[i].Name, func(sb *sandbox.Sandbox) error {
			if sb.State != statePending || sb.Attrs.Cluster.Node != node {
				return errSkip
			}
			sb.Attrs.Cluster.Node, sb.Attrs.Cluster.BoundAt = "", time.Time{} // the class and expected duration stay
			sb.Message = "node " + node + " was lost before it made the sandbox; waiting for another"
			return nil
		})
		switch {
		case err == nil:
			r.log.Warn("sandbox unbound from a lost node", "sandbox_id", l.Items[i].Name, "node", node)
		case errors.Is(err, errSkip), errs.Is(err, errs.NotFound):
		default:
			errList = append(errList, err)
		}
	}
	return errors.Join(errList...)
}
