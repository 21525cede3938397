package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/duration"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// maxCreateBody bounds a create body (it is read whole: it is parsed here
// and sent again to the node).
const maxCreateBody = 1 << 20

// maxAnswer bounds a node's answer that the replica reads (create, fork).
const maxAnswer = 8 << 20

// createTimeout bounds a forwarded create: a node may fetch a template's
// layers first. The client leaving does not cut it short (the node's
// work, and the object's bookkeeping, finish either way).
const createTimeout = 5 * time.Minute

// readBody reads a bounded request body.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "read body")
	}
	if int64(len(b)) > limit {
		return nil, errs.E(errs.InvalidArgument, "body over %d bytes", limit)
	}
	return b, nil
}

// restSpec parses POST /v1/sandboxes's body (strictly, as one host does).
func restSpec(body []byte, p auth.Principal) (createSpec, error) {
	var c wire.CreateRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if err := httpx.DecodeReader(bytes.NewReader(body), &c); err != nil {
			return createSpec{}, err
		}
	}
	spec := createSpec{Owner: p.Owner, Template: c.Template, Runtime: c.Runtime, Labels: c.Labels,
		ExpiryAction: sandbox.ExpiryAction(c.ExpiryAction)}
	if c.Owner != "" {
		if !p.Admin && c.Owner != p.Owner {
			return createSpec{}, errs.Field("owner", "only the admin key may create sandboxes for another owner")
		}
		if err := auth.ValidOwner("owner", c.Owner); err != nil {
			return createSpec{}, err
		}
		spec.Owner = c.Owner
	}
	ttl, err := duration.Parse(c.TTL)
	if err != nil || ttl < 0 {
		return createSpec{}, errs.Field("ttl", "must be a duration like 15m, 2h or 1d, got %q", c.TTL)
	}
	spec.TTL = ttl
	if c.CPU < 0 {
		return createSpec{}, errs.Field("cpu", "must be positive")
	}
	spec.Resources = sandbox.Resources{CPUMillis: int(c.CPU * 1000), MemoryMiB: c.MemoryMiB, DiskMiB: c.DiskMiB, Pids: c.Pids}
	if err := sandbox.ValidateResources(spec.Resources, sandbox.Resources{}); err != nil {
		return createSpec{}, err
	}
	if err := sandbox.ValidateLabels("labels", c.Labels); err != nil {
		return createSpec{}, err
	}
	if spec.Class, spec.Expected, err = parseExpected("expected_duration", c.ExpectedDuration); err != nil {
		return createSpec{}, err
	}
	return spec, nil
}

// e2bCreateBody is the part of E2B's NewSandbox body placement reads; the
// node reads the rest (and validates all of it).
type e2bCreateBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	AutoPause  bool              `json:"autoPause"`
}

// e2bMaxTimeout caps an E2B timeout, as internal/e2b does.
const e2bMaxTimeout = 24 * time.Hour

// e2bSpec parses E2B's create body (leniently, as internal/e2b does).
func e2bSpec(body []byte, owner, baseTemplate string, v2 bool) (createSpec, error) {
	var b e2bCreateBody
	if len(bytes.TrimSpace(body)) > 0 {
		// Lenient, as internal/e2b: the SDKs send fields berth ignores.
		if err := json.Unmarshal(body, &b); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return createSpec{}, errs.Field(te.Field, "must be %s, got %s", te.Type, te.Value)
			}
			return createSpec{}, errs.Field("body", "not a JSON object: %v", err)
		}
	}
	if b.TemplateID == "" {
		return createSpec{}, errs.Field("templateID", "is required (E2B's default is \"base\")")
	}
	tmpl := b.TemplateID
	if tmpl == "base" {
		tmpl = baseTemplate
	}
	ttl := 300 * time.Second
	if !v2 {
		ttl = 15 * time.Second
	}
	if b.Timeout != nil {
		ttl = e2bMaxTimeout // also where the seconds would overflow a Duration
		if *b.Timeout < int64(e2bMaxTimeout/time.Second) {
			ttl = time.Duration(max(*b.Timeout, 0)) * time.Second
		}
	}
	if err := sandbox.ValidateLabels("metadata", b.Metadata); err != nil {
		return createSpec{}, err
	}
	act := sandbox.ExpireDelete
	if b.AutoPause {
		act = sandbox.ExpirePause
	}
	return createSpec{Owner: owner, Template: tmpl, Labels: b.Metadata, TTL: ttl, ExpiryAction: act}, nil
}

// nodeAnswer is a node's answer, read whole.
type nodeAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a *nodeAnswer) write(w http.ResponseWriter) {
	for _, k := range []string{"Content-Type", "X-Next-Token"} {
		if v := a.header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// retryable: a node that is full (its own admission refused) or did not
// answer; the next-best node is tried once.
func (a *nodeAnswer) retryable() bool {
	return a.status == http.StatusTooManyRequests || a.status == http.StatusServiceUnavailable || a.status == http.StatusBadGateway
}

// create places spec, binds a new Sandbox object to the chosen node and
// forwards the client's request (body as sent) to it, signed for p with
// the object's id. It returns the node's answer, to be sent on as is.
//
// Two replicas may both see the last room on a node and bind there: the
// node's own admission is the final check. Its refusal (429), or a node
// that does not answer, costs the object (deleted: the node, should it
// have made the sandbox after all, removes what has no object) and one
// more try on the next-best node.
func (r *Replica) create(ctx context.Context, in *http.Request, body []byte, spec createSpec, p peer.Principal) (*nodeAnswer, error) {
	if spec.Template == "" {
		spec.Template = r.cfg.DefaultTemplate
	}
	tpl, err := r.cfg.Store.GetTemplate(ctx, spec.Template)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, errs.Field("template", "unknown template %q (see `berth template ls`)", spec.Template)
		}
		return nil, err
	}
	if tpl.State != "" && tpl.State != "ready" {
		return nil, errs.Field("template", "template %q is %s, not ready", spec.Template, tpl.State)
	}
	if spec.TTL == 0 {
		spec.TTL = r.cfg.DefaultTTL
	}
	if err := r.checkQuota(ctx, spec); err != nil {
		return nil, err
	}
	excluded := map[string]bool{}
	var (
		lastAns *nodeAnswer // the last node's refusal, or
		lastErr error       // why it did not answer
	)
	for attempt := range 2 {
		dec, err := r.place(ctx, spec, tpl.Fingerprint, excluded)
		if err != nil {
			if attempt > 0 && errs.Is(err, errs.ResourceExhausted) {
				break // nothing else fits: the refusal says more
			}
			if r.cfg.QueueWait > 0 && errs.Is(err, errs.ResourceExhausted) {
				return r.queue(ctx, in, body, spec, tpl.Fingerprint, p, err) // scheduler.go's queue
			}
			return nil, err
		}
		if dec.WarmHit {
			ans, done, err := r.createWarm(ctx, in, body, spec, tpl, dec, p)
			if done {
				return ans, err
			}
			r.log.Warn("node refused a warm create; trying the next-best node once", "node", dec.Node, "err", err, "status", statusOf(ans))
			excluded[dec.Node] = true
			lastAns, lastErr = ans, err
			continue
		}
		id := sandbox.NewID()
		now := r.now().UTC()
		sb := &sandbox.Sandbox{
			ID: id, Owner: spec.Owner, Template: spec.Template, TemplateID: tpl.Fingerprint, Runtime: spec.Runtime,
			State: sandbox.Creating, Labels: spec.Labels, Resources: withDefaults(spec.Resources),
			CreatedAt: now, ExpiresAt: now.Add(spec.TTL), ExpiryAction: spec.ExpiryAction,
		}
		sb.Attrs.Cluster = sandbox.ClusterState{Node: dec.Node, ExpectedDuration: dec.Expected.String(),
			DurationClass: string(dec.Class), BoundAt: now}
		if err := r.cfg.Store.CreateSandbox(ctx, sb); err != nil {
			return nil, err
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
		ans, err := r.send(fctx, dec.Node, in, body, &p, id)
		cancel()
		if err == nil && ans.status/100 == 2 {
			r.log.Info("sandbox created", "sandbox_id", id, "node", dec.Node, "owner", spec.Owner, "template", spec.Template,
				"class", dec.Class, "expected", dec.Expected, "warm", dec.WarmHit, "cached", dec.CacheHit)
			r.markStarted(ctx, id, ans)
			return ans, nil
		}
		// The node did not make it: its object goes, so no one waits for it.
		if derr := r.cfg.Store.DeleteSandbox(context.WithoutCancel(ctx), id); derr != nil && !errs.Is(derr, errs.NotFound) {
			r.log.Warn("remove the object of a refused create", "sandbox_id", id, "node", dec.Node, "err", derr)
		}
		if err == nil && !ans.retryable() {
			return ans, nil // the node's verdict on the request itself (a bad field...)
		}
		r.log.Warn("node refused a create; trying the next-best node once", "node", dec.Node, "err", err, "status", statusOf(ans))
		excluded[dec.Node] = true
		lastAns, lastErr = ans, err
	}
	if lastErr != nil {
		return nil, lastErr
	}
	return lastAns, nil
}

func statusOf(a *nodeAnswer) int {
	if a == nil {
		return 0
	}
	return a.status
}

// markStarted moves the object from creating to running when the node's
// answer says it runs and the node has not mirrored anything newer yet,
// so a list right after the create shows it as the answer did.
func (r *Replica) markStarted(ctx context.Context, id string, ans *nodeAnswer) {
	var view struct {
		State     string    `json:"state"`
		StartedAt time.Time `json:"started_at"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	_ = json.Unmarshal(ans.body, &view)
	if view.State != "" && view.State != string(sandbox.Running) {
		return
	}
	errStale := errs.E(errs.Conflict, "mirrored already")
	_, err := r.cfg.Store.UpdateSandbox(context.WithoutCancel(ctx), id, func(sb *sandbox.Sandbox) error {
		if sb.State != sandbox.Creating {
			return errStale
		}
		sb.State = sandbox.Running
		if !view.StartedAt.IsZero() {
			sb.StartedAt = view.StartedAt
		} else if sb.StartedAt.IsZero() {
			sb.StartedAt = r.now().UTC()
		}
		if !view.ExpiresAt.IsZero() {
			sb.ExpiresAt = view.ExpiresAt
		}
		return nil
	})
	if err != nil && err != errStale && !errs.Is(err, errs.NotFound) {
		r.log.Warn("mark created sandbox running", "sandbox_id", id, "err", err)
	}
}

// place lists the fleet and asks placement.
func (r *Replica) place(ctx context.Context, spec createSpec, fingerprint string, excluded map[string]bool) (placement.Decision, error) {
	var nl berthv1.NodeList
	if err := r.cfg.Kube.List(ctx, berthv1.Nodes, r.cfg.Namespace, kube.ListOptions{}, &nl); err != nil {
		return placement.Decision{}, err
	}
	r.nodes.put(nl.Items)
	leases, err := r.leases(ctx)
	if err != nil {
		return placement.Decision{}, err
	}
	nodes := nl.Items[:0:0]
	bound := map[string][]*sandbox.Sandbox{}
	for _, n := range nl.Items {
		if excluded[n.Name] {
			continue
		}
		nodes = append(nodes, n)
		if ready, _, _ := nodeHealth(&n, leases[n.Name], r.now()); !ready {
			continue // ruled out anyway: no need to read what it runs
		}
		sbs, err := r.sandboxesOnNode(ctx, n.Name)
		if err != nil {
			return placement.Decision{}, err
		}
		bound[n.Name] = sbs
	}
	pol := placement.DefaultPolicy()
	req := placementRequest("", spec, fingerprint)
	r.mu.Lock()
	req = r.learner.Fill(req)
	r.mu.Unlock()
	dec, err := pol.Place(req, placementNodes(nodes, leases, bound, spec.Runtime, DefaultResources, pol, r.now()), r.now())
	r.metrics.placement(dec, err)
	return dec, err
}

// leases reads the node Leases, by node name.
func (r *Replica) leases(ctx context.Context) (map[string]*kube.Lease, error) {
	var ll struct {
		Items []kube.Lease `json:"items"`
	}
	if err := r.cfg.Kube.List(ctx, kube.Leases, r.cfg.Namespace, kube.ListOptions{}, &ll); err != nil {
		return nil, err
	}
	out := map[string]*kube.Lease{}
	for i := range ll.Items {
		if node, ok := strings.CutPrefix(ll.Items[i].Name, berthv1.NodeLeaseName("")); ok && node != "" {
			out[node] = &ll.Items[i]
		}
	}
	return out, nil
}

// observe tells the learner how long a sandbox of fingerprint fp lived.
func (r *Replica) observe(sb *sandbox.Sandbox) {
	if sb.TemplateID == "" || sb.CreatedAt.IsZero() {
		return
	}
	r.mu.Lock()
	r.learner.Observe(sb.TemplateID, r.now().Sub(sb.CreatedAt))
	r.mu.Unlock()
}

func (r *Replica) createREST(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	body, err := readBody(req, maxCreateBody)
	if err != nil {
		return err
	}
	spec, err := restSpec(body, p)
	if err != nil {
		return err
	}
	ans, err := r.create(req.Context(), req, body, spec, peer.Principal{Owner: p.Owner, Admin: p.Admin})
	if err != nil {
		return err
	}
	ans.write(w)
	return nil
}

// createWarm serves a create placed on a node for its warm pool member: the
// request goes without an id (signed as usual), so the node's daemon claims
// a member, whose id is its own, or, had another create taken the last one,
// makes one cold with a new id. The object is written from the answer, as a
// fork's children are (so quota counts it only from then on). The node keeps
// a sandbox made so (Attrs.Cluster.AdoptFrom) for its adoption grace without
// an object, then deletes it: that covers this replica dying in between.
// done is false when the node refused as full or did not answer (nothing
// was written: the caller tries the next-best node).
func (r *Replica) createWarm(ctx context.Context, in *http.Request, body []byte, spec createSpec, tpl store.Template,
	dec placement.Decision, p peer.Principal) (_ *nodeAnswer, done bool, _ error) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	ans, err := r.send(fctx, dec.Node, in, body, &p, "")
	cancel()
	if err != nil || ans.retryable() {
		return ans, false, err
	}
	if ans.status/100 != 2 {
		return ans, true, nil // the node's verdict on the request itself
	}
	v := warmView(ans.body)
	if !sandbox.ValidID(v.id()) {
		return nil, true, errs.E(errs.Unavailable, "node %s answered a create with no valid sandbox id", dec.Node)
	}
	now := r.now().UTC()
	sb := &sandbox.Sandbox{
		ID: v.id(), Owner: spec.Owner, Template: spec.Template, TemplateID: tpl.Fingerprint, Runtime: spec.Runtime,
		State: sandbox.Running, Labels: spec.Labels, Resources: withDefaults(spec.Resources),
		CreatedAt: now, StartedAt: now, ExpiresAt: now.Add(spec.TTL), ExpiryAction: spec.ExpiryAction,
	}
	if v.Runtime != "" {
		sb.Runtime = v.Runtime
	}
	if v.State != "" && sandbox.ValidState(v.State) {
		sb.State = sandbox.State(v.State)
	}
	if !v.StartedAt.IsZero() {
		sb.StartedAt = v.StartedAt
	}
	if !v.ExpiresAt.IsZero() {
		sb.ExpiresAt = v.ExpiresAt
	}
	sb.Attrs.Cluster = sandbox.ClusterState{Node: dec.Node, ExpectedDuration: dec.Expected.String(),
		DurationClass: string(dec.Class), BoundAt: now}
	// An id that has an object already is refused too: only replicas create
	// objects, so a node answering one is wrong (or lying about another's).
	if err := r.cfg.Store.CreateSandbox(context.WithoutCancel(ctx), sb); err != nil {
		// The client is told it failed; the node deletes the sandbox once
		// its adoption grace has passed with no object.
		r.log.Warn("record a warm create's object", "sandbox_id", sb.ID, "node", dec.Node, "err", err)
		if errs.Is(err, errs.AlreadyExists) {
			err = errs.E(errs.Unavailable, "node %s answered a create with sandbox id %s, which is another sandbox's", dec.Node, sb.ID)
		}
		return nil, true, err
	}
	// claimed is what the node did ("" when its answer does not say: E2B's
	// create answer has no pool field); warm is what placement expected.
	r.log.Info("sandbox created", "sandbox_id", sb.ID, "node", dec.Node, "owner", spec.Owner, "template", spec.Template,
		"class", dec.Class, "expected", dec.Expected, "warm", dec.WarmHit, "claimed", v.Extra[claimedKey], "cached", dec.CacheHit)
	return ans, true, nil
}

// claimedKey is the REST answer's extra key naming the pool a sandbox was
// claimed from (sandbox.Attrs.LegacyExtra).
const claimedKey = "claimed_from_pool"

// warmAnswer is what the replica reads of a node's create answer: berth's
// REST form (wire.Sandbox) or E2B's (sandboxID).
type warmAnswer struct {
	ID        string            `json:"id"`
	SandboxID string            `json:"sandboxID"`
	State     string            `json:"state"`
	Runtime   string            `json:"runtime"`
	StartedAt time.Time         `json:"started_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Extra     map[string]string `json:"extra"`
}

func (w warmAnswer) id() string {
	if w.ID != "" {
		return w.ID
	}
	return w.SandboxID
}

func warmView(body []byte) warmAnswer {
	var v warmAnswer
	_ = json.Unmarshal(body, &v) // a bad answer has no valid id, which the caller checks
	return v
}
