package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// proxyREST sends /v1/sandboxes/{id}/... to the sandbox's node, signed for
// the caller. A fork's children, made on that node, get their objects
// from the answer.
func (r *Replica) proxyREST(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	sb, err := r.visible(req, scope(req, p), req.PathValue("id"))
	if err != nil {
		return err
	}
	if sb.State == sandbox.Lost && req.Method == http.MethodGet && req.PathValue("rest") == "events" {
		// Its node is gone; the store has what the cluster recorded
		// (the loss itself, and what the node mirrored before).
		return r.lostEvents(w, req, sb)
	}
	var after func(*http.Response) error
	if req.Method == http.MethodPost && req.PathValue("rest") == "fork" {
		after = func(resp *http.Response) error { return r.recordREST(req.Context(), sb, resp) }
	}
	r.proxy(w, req, sb, &peer.Principal{Owner: p.Owner, Admin: p.Admin}, styleREST, after)
	return nil
}

// portProxy forwards /v1/sandboxes/{id}/ports/{port}/...: with an API key
// it is checked here and signed; without one the node checks the port's
// own credential.
func (r *Replica) portProxy(w http.ResponseWriter, req *http.Request) {
	var pp *peer.Principal
	owner := ""
	if key := auth.KeyFromRequest(req); key != "" {
		p, err := r.authenticate(req, key)
		if err != nil {
			writeError(w, err)
			return
		}
		pp, owner = &peer.Principal{Owner: p.Owner, Admin: p.Admin}, scope(req, p)
	}
	sb, err := r.visible(req, owner, req.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	r.proxy(w, req, sb, pp, styleREST, nil)
}

// deleteREST deletes through the node, then the object if the node left
// it. A lost sandbox's node is not asked: its object goes at once (the
// node, should it return, removes what has no object).
func (r *Replica) deleteREST(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	sb, err := r.visible(req, scope(req, p), req.PathValue("id"))
	if err != nil {
		return err
	}
	if sb.State == sandbox.Lost || sb.Attrs.Cluster.Node == "" {
		if err := r.forget(req.Context(), sb); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	r.proxy(w, req, sb, &peer.Principal{Owner: p.Owner, Admin: p.Admin}, styleREST, func(resp *http.Response) error {
		return r.afterDelete(req.Context(), sb, resp)
	})
	return nil
}

// afterDelete removes the object once the node has deleted the sandbox
// (2xx) or does not know it (404: it never made it, or lost its journal).
func (r *Replica) afterDelete(ctx context.Context, sb *sandbox.Sandbox, resp *http.Response) error {
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return nil
	}
	if err := r.forget(ctx, sb); err != nil {
		r.log.Warn("delete the object of a deleted sandbox", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	if resp.StatusCode == http.StatusNotFound {
		// The object was all there was: the client asked to delete and it is gone.
		resp.StatusCode, resp.Status = http.StatusNoContent, "204 No Content"
		resp.Body = http.NoBody
		resp.ContentLength = 0
		resp.Header.Del("Content-Length")
		resp.Header.Del("Content-Type")
	}
	return nil
}

// forget deletes sb's object (gone already is fine) and tells the learner
// how long it lived.
func (r *Replica) forget(ctx context.Context, sb *sandbox.Sandbox) error {
	err := r.cfg.Store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	if err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	if sb.State != sandbox.Lost {
		r.observe(sb)
	}
	r.kick() // its room may be what a pending sandbox waits for
	return nil
}

// recordREST writes the objects of a REST fork's children (wire.ForkResult).
func (r *Replica) recordREST(ctx context.Context, parent *sandbox.Sandbox, resp *http.Response) error {
	if resp.StatusCode/100 != 2 {
		return nil
	}
	b, err := readResponse(resp)
	if err != nil {
		return err
	}
	var fr wire.ForkResult
	if err := json.Unmarshal(b, &fr); err != nil {
		r.log.Warn("fork answer unreadable; children not recorded", "sandbox_id", parent.ID, "err", err)
		return nil
	}
	for _, c := range fr.Sandboxes {
		child := &sandbox.Sandbox{
			ID: c.ID, Owner: c.Owner, Template: c.Template, TemplateID: c.TemplateID, Runtime: c.Runtime,
			State: sandbox.State(c.State), Reason: c.Reason, Labels: c.Labels, Resources: sandbox.Resources(c.Resources),
			CreatedAt: c.CreatedAt, StartedAt: c.StartedAt, ExpiresAt: c.ExpiresAt, ExpiryAction: sandbox.ExpiryAction(c.ExpiryAction),
		}
		r.recordChild(ctx, parent, child)
	}
	return nil
}

// recordChild creates the object of a sandbox a node made from parent
// (bound to the parent's node), unless the node recorded it first.
func (r *Replica) recordChild(ctx context.Context, parent, child *sandbox.Sandbox) {
	if !sandbox.ValidID(child.ID) {
		return
	}
	if child.Owner == "" {
		child.Owner = parent.Owner
	}
	if child.State == "" || !sandbox.ValidState(string(child.State)) {
		child.State = sandbox.Running
	}
	now := r.now().UTC()
	if child.CreatedAt.IsZero() {
		child.CreatedAt = now
	}
	child.Attrs.Cluster = sandbox.ClusterState{Node: parent.Attrs.Cluster.Node, ExpectedDuration: parent.Attrs.Cluster.ExpectedDuration,
		DurationClass: parent.Attrs.Cluster.DurationClass, BoundAt: now}
	child.Attrs.Lineage.Parent = parent.ID
	err := r.cfg.Store.CreateSandbox(context.WithoutCancel(ctx), child)
	if err != nil && !errs.Is(err, errs.AlreadyExists) {
		r.log.Warn("record a fork's child", "sandbox_id", child.ID, "parent", parent.ID, "err", err)
	}
}

// e2bForkChild is one entry of E2B's fork answer.
type e2bForkChild struct {
	Sandbox *struct {
		SandboxID  string `json:"sandboxID"`
		TemplateID string `json:"templateID"`
	} `json:"sandbox"`
}

// recordE2B writes the objects of an E2B fork's children: the answer
// names only id and template; the rest is the parent's.
func (r *Replica) recordE2B(ctx context.Context, parent *sandbox.Sandbox, resp *http.Response) error {
	if resp.StatusCode/100 != 2 {
		return nil
	}
	b, err := readResponse(resp)
	if err != nil {
		return err
	}
	var out []e2bForkChild
	if err := json.Unmarshal(b, &out); err != nil {
		r.log.Warn("fork answer unreadable; children not recorded", "sandbox_id", parent.ID, "err", err)
		return nil
	}
	for _, c := range out {
		if c.Sandbox == nil {
			continue
		}
		child := &sandbox.Sandbox{ID: c.Sandbox.SandboxID, Owner: parent.Owner, Template: parent.Template,
			TemplateID: parent.TemplateID, Runtime: parent.Runtime, Labels: parent.Labels, Resources: parent.Resources,
			ExpiresAt: parent.ExpiresAt, ExpiryAction: parent.ExpiryAction}
		r.recordChild(ctx, parent, child)
	}
	return nil
}

// isFork reports whether an E2B path is a fork of {id}.
func isFork(method, rest string) bool {
	return method == http.MethodPost && strings.TrimSuffix(rest, "/") == "fork"
}

// lostEvents answers GET /v1/sandboxes/{id}/events of a lost sandbox from
// the store, in the node's form (a list of wire.Event).
func (r *Replica) lostEvents(w http.ResponseWriter, req *http.Request, sb *sandbox.Sandbox) error {
	f := store.EventFilter{SandboxID: sb.ID}
	q := req.URL.Query()
	if a := q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return errs.Field("after", "must be an event sequence number")
		}
		f.AfterSeq = n
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a non-negative integer")
		}
		f.Limit = n
	}
	list, err := r.cfg.Store.ListEvents(req.Context(), f)
	if err != nil {
		return err
	}
	out := make([]wire.Event, 0, len(list))
	for _, e := range list {
		out = append(out, wire.Event{Seq: e.Seq, SandboxID: e.SandboxID, Owner: e.Owner, Time: e.Time, Actor: e.Actor,
			Type: e.Type, From: wire.State(e.From), To: wire.State(e.To), Reason: e.Reason, Message: e.Message, Data: e.Data})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
