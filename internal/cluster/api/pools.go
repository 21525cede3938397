package api

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/template"
)

// Warm pools on a replica are WarmPool objects, one per template. Every
// node keeps its own pool of each (internal/cluster/node/pools.go), sized
// from the claims it sees and clamped to [min, max]: the figures of a
// pool are per node. A fixed pool of size N (one host's `--size N`
// without --auto) is min = max = N; --auto keeps min and max as given.
// The request's own size and auto flag ride as annotations, so GET
// answers what was set; a WarmPool made by hand (kubectl) has neither and
// reads as auto when min != max.
const (
	annPoolSize = "berth.dev/pool-size"
	annPoolAuto = "berth.dev/pool-auto"
)

func (r *Replica) poolRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/pools", r.listPools)
	r.handle(mux, "PUT /v1/pools/{template}", r.setPool)
	r.handle(mux, "DELETE /v1/pools/{template}", r.deletePool)
}

var poolDNSNameRe = lazyregexp.New(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// poolObjectName is the WarmPool object name of template name: the name
// when it is a DNS subdomain, else "p." and a hash ('_' is a template
// name's and not an object name's).
func poolObjectName(name string) string {
	if poolDNSNameRe.MatchString(name) && !strings.HasPrefix(name, "p.") {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "p." + hex.EncodeToString(sum[:])[:40]
}

// warmPools lists the WarmPool objects, one per template: the first by
// object name wins, as on the nodes.
func (r *Replica) warmPools(ctx context.Context) ([]berthv1.WarmPool, error) {
	var l berthv1.WarmPoolList
	if err := r.cfg.Kube.List(ctx, berthv1.WarmPools, r.cfg.Namespace, kube.ListOptions{}, &l); err != nil {
		return nil, err
	}
	slices.SortFunc(l.Items, func(a, b berthv1.WarmPool) int { return strings.Compare(a.Name, b.Name) })
	seen := map[string]bool{}
	out := l.Items[:0]
	for _, wp := range l.Items {
		if wp.Spec.Template == "" || seen[wp.Spec.Template] {
			continue
		}
		seen[wp.Spec.Template] = true
		out = append(out, wp)
	}
	return out, nil
}

// aliveNodes is the set of nodes whose agents run (Ready, Lease fresh).
func (r *Replica) aliveNodes(ctx context.Context) (map[string]bool, error) {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return nil, err
	}
	leases, err := r.leases(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for i := range nl.Items {
		if n := &nl.Items[i]; r.alive(n, leases[n.Name]) {
			out[n.Name] = true
		}
	}
	return out, nil
}

// poolView is a WarmPool in one host's form. Ready sums the reports of
// the nodes alive now (a dead node's last report stays in the object
// until the node is gone); Target is min per alive node, the floor every
// node keeps. The counters one host has (hits, claim latency, idle
// memory) are each node's: its own /metrics.
func poolView(wp *berthv1.WarmPool, alive map[string]bool) wire.PoolStatus {
	sp := wp.Spec
	out := wire.PoolStatus{Template: sp.Template, Runtime: sp.Runtime, Min: int(sp.Min), Max: int(sp.Max),
		Resources: wire.Resources{CPUMillis: int(sp.Resources.CPUMillis), MemoryMiB: sp.Resources.MemoryMiB,
			DiskMiB: sp.Resources.DiskMiB, Pids: sp.Resources.Pids}}
	out.Auto = sp.Min != sp.Max
	if v, ok := wp.Annotations[annPoolAuto]; ok {
		out.Auto = v == "true"
	}
	out.Size = int(sp.Min)
	if v, err := strconv.Atoi(wp.Annotations[annPoolSize]); err == nil {
		out.Size = v
	}
	if !out.Auto {
		out.Min, out.Max = 0, 0
	}
	for node, n := range wp.Status.PerNode {
		if alive[node] {
			out.Ready += int(n)
		}
	}
	out.Target = int(sp.Min) * len(alive)
	switch {
	case len(alive) == 0:
		out.State = "waiting"
	case out.Ready >= out.Target:
		out.State = "ready"
	default:
		out.State = "filling"
	}
	return out
}

func (r *Replica) listPools(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may see warm pools")
	}
	pools, err := r.warmPools(req.Context())
	if err != nil {
		return err
	}
	alive, err := r.aliveNodes(req.Context())
	if err != nil {
		return err
	}
	out := make([]wire.PoolStatus, 0, len(pools))
	for i := range pools {
		out = append(out, poolView(&pools[i], alive))
	}
	slices.SortFunc(out, func(a, b wire.PoolStatus) int { return cmp.Compare(a.Template, b.Template) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

// poolSpec checks a PUT's body as one host's pool service does and turns
// it into a WarmPool spec.
func (r *Replica) poolSpec(ctx context.Context, name string, req wire.PoolRequest) (berthv1.WarmPoolSpec, error) {
	var sp berthv1.WarmPoolSpec
	if err := template.ValidName(name); err != nil {
		return sp, errs.Field("template", "%s", err.Error())
	}
	if req.Size == nil {
		return sp, errs.Field("size", "must be set (0 keeps the pool empty)")
	}
	size := *req.Size
	if size < 0 || size > pool.MaxSize {
		return sp, errs.Field("size", "must be between 0 and %d, got %d", pool.MaxSize, size)
	}
	if req.CPU < 0 {
		return sp, errs.Field("cpu", "must be positive")
	}
	if req.CPU > 1e6 {
		return sp, errs.Field("cpu", "must be at most 1000000 cores, got %g", req.CPU)
	}
	res := sandbox.Resources{CPUMillis: int(req.CPU * 1000), MemoryMiB: req.MemoryMiB, DiskMiB: req.DiskMiB, Pids: req.Pids}
	runtimes, largest, err := r.fleetShape(ctx)
	if err != nil {
		return sp, err
	}
	// A member must fit the largest registered node (each node's pool
	// service then bounds the shape by its own limits); with no node yet,
	// only the signs are checked.
	if err := sandbox.ValidateResources(res, largest); err != nil {
		return sp, err
	}
	if req.Runtime != "" && !runtimes[req.Runtime] {
		return sp, errs.Field("runtime", "unknown runtime %q (no registered node offers it)", req.Runtime)
	}
	lo, hi := size, size
	if req.Auto {
		lo, hi = req.Min, req.Max
		if hi == 0 {
			hi = max(size, 1) * 4
		}
		if lo < 0 || lo > hi || hi > pool.MaxSize {
			return sp, errs.Field("max", "need 0 <= min <= max <= %d, got min %d max %d", pool.MaxSize, lo, hi)
		}
	} else {
		if req.Min != 0 || req.Max != 0 {
			return sp, errs.Field("min", "min and max need auto sizing (--auto)")
		}
		// A node reads max 0 as "no upper bound", so an empty fixed pool
		// cannot be written; removing the pool is what keeps nothing.
		if size == 0 {
			return sp, errs.Field("size", "a cluster keeps no empty pool: remove it instead (DELETE /v1/pools/%s, berth pool rm %s)", name, name)
		}
	}
	return berthv1.WarmPoolSpec{Template: name, Runtime: req.Runtime, Min: int32(lo), Max: int32(hi),
		Resources: berthv1.Resources{CPUMillis: int64(res.CPUMillis), MemoryMiB: res.MemoryMiB, DiskMiB: res.DiskMiB, Pids: res.Pids}}, nil
}

// fleetShape is the runtimes the registered nodes offer and the largest
// capacity of any of them, per resource.
func (r *Replica) fleetShape(ctx context.Context) (map[string]bool, sandbox.Resources, error) {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return nil, sandbox.Resources{}, err
	}
	runtimes := map[string]bool{}
	var largest sandbox.Resources
	for _, n := range nl.Items {
		for _, rt := range n.Status.Runtimes {
			runtimes[rt.Name] = true
		}
		c := n.Status.Capacity
		largest.CPUMillis = max(largest.CPUMillis, int(c.CPUMillis))
		largest.MemoryMiB = max(largest.MemoryMiB, c.MemoryMiB)
		largest.DiskMiB = max(largest.DiskMiB, c.DiskMiB)
	}
	return runtimes, largest, nil
}

// setPool writes the template's WarmPool: the spec replaced, the nodes'
// reports (status) kept. Nodes write the status with conditional updates
// too, so a conflict is re-read and retried.
func (r *Replica) setPool(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may configure warm pools")
	}
	var body wire.PoolRequest
	if err := httpx.Decode(req, &body); err != nil {
		return err
	}
	ctx := req.Context()
	name := req.PathValue("template")
	spec, err := r.poolSpec(ctx, name, body)
	if err != nil {
		return err
	}
	ann := map[string]string{annPoolSize: strconv.Itoa(*body.Size), annPoolAuto: strconv.FormatBool(body.Auto)}
	var out berthv1.WarmPool
	for attempt := 0; ; attempt++ {
		pools, err := r.warmPools(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(pools, func(wp berthv1.WarmPool) bool { return wp.Spec.Template == name })
		if i < 0 {
			wp := berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"},
				ObjectMeta: kube.ObjectMeta{Name: poolObjectName(name), Namespace: r.cfg.Namespace, Annotations: ann}, Spec: spec}
			err = r.cfg.Kube.Create(ctx, berthv1.WarmPools, r.cfg.Namespace, &wp, &out)
		} else {
			wp := pools[i]
			if wp.Annotations == nil {
				wp.Annotations = map[string]string{}
			}
			for k, v := range ann {
				wp.Annotations[k] = v
			}
			wp.Spec = spec
			err = r.cfg.Kube.Update(ctx, berthv1.WarmPools, r.cfg.Namespace, wp.Name, &wp, &out)
		}
		if err == nil {
			break
		}
		if attempt == 4 || !(errs.Is(err, errs.Conflict) || errs.Is(err, errs.AlreadyExists)) {
			return err
		}
	}
	alive, err := r.aliveNodes(ctx)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, poolView(&out, alive))
	return nil
}

// deletePool removes the template's WarmPool objects; each node drops its
// local pool (drains its members) on its next pass.
func (r *Replica) deletePool(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may configure warm pools")
	}
	ctx := req.Context()
	name := req.PathValue("template")
	var l berthv1.WarmPoolList
	if err := r.cfg.Kube.List(ctx, berthv1.WarmPools, r.cfg.Namespace, kube.ListOptions{}, &l); err != nil {
		return err
	}
	found := false
	for _, wp := range l.Items {
		if wp.Spec.Template != name {
			continue
		}
		if err := r.cfg.Kube.Delete(ctx, berthv1.WarmPools, r.cfg.Namespace, wp.Name, kube.DeleteOptions{}); err != nil && !errs.Is(err, errs.NotFound) {
			return err
		}
		found = true
	}
	if !found {
		return errs.E(errs.NotFound, "no pool for template %q", name)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
