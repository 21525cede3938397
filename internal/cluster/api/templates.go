package api

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// HeaderNode names, on a forwarded template import, pull or build, the
// node that made it.
const HeaderNode = "Berth-Node"

// Template imports, pulls and builds run on one node, streamed there
// (the tar body) and back (the progress lines) as on one host; the node
// publishes the template it made as a Template object, so every replica's
// GET /v1/templates shows it, and creates elsewhere pull its layers from
// there. The build history is each node's journal: GET /v1/builds asks
// every node and merges (a failed build has no Template object to carry
// its node, so a record on the object could not find it).
func (r *Replica) templateRoutes(mux *http.ServeMux) {
	r.handle(mux, "PUT /v1/templates/{name}/tar", r.forwardTemplate)
	r.handle(mux, "POST /v1/templates/{name}/pull", r.forwardTemplate)
	r.handle(mux, "POST /v1/templates/{name}/build", r.forwardTemplate)
	r.handle(mux, "GET /v1/builds", r.builds)
	r.handle(mux, "DELETE /v1/templates/{name}", r.deleteTemplate)
}

func (r *Replica) forwardTemplate(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	// The node refuses a tenant too; refusing here spares shipping the tar.
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may import, pull or build templates")
	}
	node, err := r.builderNode(req.Context(), req.URL.Query().Get("node"))
	if err != nil {
		return err
	}
	w.Header().Set(HeaderNode, node)
	r.proxyNode(w, req, node, "template "+req.PathValue("name"), &peer.Principal{Owner: p.Owner, Admin: true}, styleREST, nil)
	return nil
}

// builderNode is the node named (it must be registered and alive), or
// else the ready node with the most memory unallocated (a build unpacks
// and runs there; ties go to the first by name).
func (r *Replica) builderNode(ctx context.Context, named string) (string, error) {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return "", err
	}
	r.nodes.put(nl.Items)
	leases, err := r.leases(ctx)
	if err != nil {
		return "", err
	}
	if named != "" {
		for i := range nl.Items {
			if n := &nl.Items[i]; n.Name == named {
				if !r.alive(n, leases[n.Name]) {
					return "", errs.E(errs.Unavailable, "node %s is not ready (its agent's lease is not fresh)", named)
				}
				return named, nil
			}
		}
		return "", errs.Field("node", "no node %q is registered", named)
	}
	best, bestFree := "", int64(-1)
	slices.SortFunc(nl.Items, func(a, b berthv1.Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range nl.Items {
		n := &nl.Items[i]
		if ready, _, _ := nodeHealth(n, leases[n.Name], r.now()); !ready {
			continue
		}
		if free := n.Status.Capacity.MemoryMiB - n.Status.Allocated.MemoryMiB; free > bestFree {
			best, bestFree = n.Name, free
		}
	}
	if best == "" {
		return "", errs.E(errs.Unavailable, "no ready node to make the template on (of %d registered)", len(nl.Items))
	}
	return best, nil
}

// builds merges the nodes' build histories, newest first; limit applies
// to the merged list.
func (r *Replica) builds(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	limit := 0
	if v := req.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a whole number >= 0, got %q", v)
		}
		limit = n
	}
	replies, missing, err := r.fanOut(req.Context(), req, p)
	if err != nil {
		return err
	}
	replies, refused := split(replies)
	if refused != nil {
		refused.write(w)
		return nil
	}
	out := wire.TemplateBuildList{Builds: []wire.TemplateBuild{}}
	for _, rp := range replies {
		var l wire.TemplateBuildList
		if err := json.Unmarshal(rp.ans.body, &l); err != nil {
			missing = append(missing, rp.node)
			continue
		}
		out.Builds = append(out.Builds, l.Builds...)
	}
	slices.SortStableFunc(out.Builds, func(a, b wire.TemplateBuild) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.Template, b.Template)
	})
	if limit > 0 && len(out.Builds) > limit {
		out.Builds = out.Builds[:limit]
	}
	slices.Sort(missing)
	setUnanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// templateDeleter is kubestore's DeleteTemplate.
type templateDeleter interface {
	DeleteTemplate(ctx context.Context, name string) error
}

// deleteTemplate removes a template from every node (asked at once; a
// node without it answers 404), then its Template object, but only once
// every registered node answered: a node that was not asked may still
// hold it, and the object is how creates find it. A refusal (a template
// in use) is sent on; the nodes that had removed it by then stay so.
// Before any node is asked, the objects are checked as one host checks
// its store (templateUnused): a sandbox bound but not yet made on its
// node uses the template too, and no node knows of it yet.
func (r *Replica) deleteTemplate(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may remove templates")
	}
	name := req.PathValue("name")
	td, ok := r.cfg.Store.(templateDeleter)
	if !ok {
		return errs.E(errs.NotImplemented, "removing templates: this replica's store cannot")
	}
	if err := r.templateUnused(req.Context(), name); err != nil {
		return err
	}
	replies, missing, err := r.fanOut(req.Context(), req, p)
	if err != nil && len(missing) == 0 {
		return err
	}
	out := wire.TemplateDeleted{Removed: name}
	found := false
	for _, rp := range replies {
		switch a := rp.ans; {
		case a.status >= 200 && a.status < 300:
			found = true
			var d wire.TemplateDeleted
			if json.Unmarshal(a.body, &d) == nil {
				out.LayersCollected += d.LayersCollected
			}
		case a.status == http.StatusNotFound:
		default:
			a.write(w)
			return nil
		}
	}
	if len(missing) > 0 {
		return errs.E(errs.Unavailable, "template %s: nodes %s did not answer; its object stays until every node has removed it (retry)", name, strings.Join(missing, ", "))
	}
	if err := td.DeleteTemplate(req.Context(), name); err != nil {
		if !errs.Is(err, errs.NotFound) || !found {
			return err
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// templateUnused refuses (409) the removal of a template that a Sandbox
// object not deleted nor lost uses (a lost one's node is gone, and with
// it what it ran), or that a WarmPool keeps warm, as one host refuses
// for its sandboxes and its pool.
func (r *Replica) templateUnused(ctx context.Context, name string) error {
	pools, err := r.warmPools(ctx)
	if err != nil {
		return err
	}
	for _, wp := range pools {
		if wp.Spec.Template == name {
			return errs.E(errs.Conflict, "template %s has a warm pool; remove it first (berth pool rm %s)", name, name)
		}
	}
	// A pool's unclaimed members are the pool's: its removal drains them
	// (each node refuses on its own while its members linger).
	var users []string
	f := store.SandboxFilter{Template: name, Limit: 500}
	for _, s := range sandbox.States() {
		if s != sandbox.Deleted && s != sandbox.Lost {
			f.States = append(f.States, s)
		}
	}
	for {
		page, next, err := r.cfg.Store.ListSandboxes(ctx, f)
		if err != nil {
			return err
		}
		for _, sb := range page {
			if !isPoolMember(sb) {
				users = append(users, sb.ID)
			}
		}
		if next == "" || len(users) >= 20 {
			break
		}
		f.After = next
	}
	if len(users) > 0 {
		return errs.E(errs.Conflict, "template %s is used by %d sandbox(es): %s; remove them first", name, len(users), strings.Join(users, ", "))
	}
	return nil
}
