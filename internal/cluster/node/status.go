package node

import (
	"context"
	"slices"
	"sort"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// renewLease writes Lease berth-node-NAME: holder = this node, renewTime now.
// A Lease another holder took (a second agent under the same name) is
// taken back and its transitions counted: two agents of one name fight
// visibly rather than silently share a Node.
func (a *Agent) renewLease(ctx context.Context) error {
	name := berthv1.NodeLeaseName(a.cfg.Name)
	now := kube.MicroTime{Time: a.cfg.Now()}
	holder := a.cfg.Name
	secs := int32(a.cfg.LeaseDuration.Seconds())
	var l kube.Lease
	err := a.cfg.Kube.Get(ctx, kube.Leases, a.cfg.Namespace, name, &l)
	if errs.Is(err, errs.NotFound) {
		zero := int32(0)
		l = kube.Lease{TypeMeta: kube.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
			ObjectMeta: kube.ObjectMeta{Name: name, Namespace: a.cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
			Spec:       kube.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now, LeaseTransitions: &zero}}
		return a.cfg.Kube.Create(ctx, kube.Leases, a.cfg.Namespace, &l, nil)
	}
	if err != nil {
		return err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
		a.log.Warn("taking over the node lease", "lease", name)
		n := int32(1)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions + 1
		}
		l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.LeaseTransitions = &holder, &now, &n
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &secs
	return a.cfg.Kube.Update(ctx, kube.Leases, a.cfg.Namespace, name, &l, nil) // conditional on l's resourceVersion
}

// Status is what the Node's status says of this host now.
func (a *Agent) Status(ctx context.Context) (berthv1.NodeStatus, error) {
	d := a.cfg.Daemon
	local, _, err := d.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return berthv1.NodeStatus{}, err
	}
	alloc, pools := Allocated(local)
	tpls, err := d.Store().ListTemplates(ctx)
	if err != nil {
		return berthv1.NodeStatus{}, err
	}
	var cached []string
	for _, t := range tpls {
		if t.State == store.TemplateReady && t.Fingerprint != "" && !slices.Contains(cached, t.Fingerprint) {
			cached = append(cached, t.Fingerprint)
		}
	}
	sort.Strings(cached)
	var rts []berthv1.NodeRuntime
	for name, rt := range d.Runtimes() {
		c := rt.Capabilities(ctx)
		nr := berthv1.NodeRuntime{Name: name}
		if c.Checkpoint {
			nr.Capabilities = append(nr.Capabilities, "memory-checkpoint")
		}
		if c.Freeze {
			nr.Capabilities = append(nr.Capabilities, "freeze")
		}
		rts = append(rts, nr)
	}
	sort.Slice(rts, func(i, j int) bool { return rts[i].Name < rts[j].Name })
	now := a.cfg.Now().UTC()
	return berthv1.NodeStatus{
		Address: a.cfg.Address, CertSHA256: a.cfg.CertSHA256,
		Capacity: Capacity(d.Config().DataDir), Allocated: alloc, Runtimes: rts,
		CachedTemplates: cached, WarmPools: pools, Version: a.cfg.Version, Heartbeat: &now,
	}, nil
}

// writeStatus creates the Node if needed and writes its status (the status
// subresource: one conditional write; a conflict is retried once on a
// fresh read). Ready is set True: a replica sets it False (LeaseExpired)
// when the Lease lapses, and this node's next write, once it is back, says
// it is ready again.
func (a *Agent) writeStatus(ctx context.Context) error {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	st, err := a.Status(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		var n berthv1.Node
		err := a.cfg.Kube.Get(ctx, berthv1.Nodes, a.cfg.Namespace, a.cfg.Name, &n)
		if errs.Is(err, errs.NotFound) {
			n = berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
				ObjectMeta: kube.ObjectMeta{Name: a.cfg.Name, Namespace: a.cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}}}
			if err = a.cfg.Kube.Create(ctx, berthv1.Nodes, a.cfg.Namespace, &n, &n); errs.Is(err, errs.AlreadyExists) && attempt == 0 {
				continue
			}
		}
		if err != nil {
			return err
		}
		st.Conditions = n.Status.Conditions
		kube.SetCondition(&st.Conditions, kube.Condition{Type: berthv1.CondNodeReady, Status: "True",
			LastTransitionTime: a.cfg.Now().UTC(), Reason: "AgentReady", Message: "the node agent renews its Lease"})
		n.Status = st
		err = a.cfg.Kube.UpdateStatus(ctx, berthv1.Nodes, a.cfg.Namespace, a.cfg.Name, &n, nil)
		if errs.Is(err, errs.Conflict) && attempt == 0 {
			continue
		}
		return err
	}
}

// publishTemplates puts each ready local template the agent has not
// published at its current fingerprint as a Template object.
func (a *Agent) publishTemplates(ctx context.Context) {
	tpls, err := a.cfg.Daemon.Store().ListTemplates(ctx)
	if err != nil {
		a.log.Warn("list templates", "err", err)
		return
	}
	for _, t := range tpls {
		if t.State != store.TemplateReady {
			continue
		}
		a.mu.Lock()
		done := a.tpls[t.Name] == t.Fingerprint
		a.mu.Unlock()
		if done {
			continue
		}
		if _, err := a.cfg.Cluster.PutTemplate(ctx, t); err != nil {
			a.log.Warn("publish template", "template", t.Name, "err", err)
			continue
		}
		a.mu.Lock()
		a.tpls[t.Name] = t.Fingerprint
		a.mu.Unlock()
	}
}

// Allocated sums what this node's sandboxes hold (holds) and counts its
// ready warm pool members per template fingerprint (unclaimed, running).
func Allocated(local []*sandbox.Sandbox) (berthv1.Resources, []berthv1.NodeWarmPool) {
	var alloc berthv1.Resources
	ready := map[string]int32{}
	for _, sb := range local {
		cpuMem, disk := holds(sb)
		if cpuMem {
			alloc.CPUMillis += int64(sb.Resources.CPUMillis)
			alloc.MemoryMiB += sb.Resources.MemoryMiB
			alloc.Pids += sb.Resources.Pids
		}
		if disk {
			alloc.DiskMiB += sb.Resources.DiskMiB
		}
		if sb.Attrs.Pool.Member != "" && sb.State == sandbox.Running && sb.TemplateID != "" {
			ready[sb.TemplateID]++
		}
	}
	var pools []berthv1.NodeWarmPool
	for fp, n := range ready {
		pools = append(pools, berthv1.NodeWarmPool{Fingerprint: fp, Ready: n})
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Fingerprint < pools[j].Fingerprint })
	return alloc, pools
}
