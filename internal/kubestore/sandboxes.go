package kubestore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// A Sandbox object's typed spec and status hold what a kubectl user reads
// and may select on (owner, template, resources, state, node, timings,
// conditions); they are the truth for those fields. The rest of the row
// (env, attrs, token hash, version, message, pause bookkeeping) is the JSON
// of sandboxRest in the annotation annSandbox: an annotation, not a status
// sub-field, because the structural schema of deploy/crds prunes fields it
// does not declare, and those fields are berth's internals, not API.
const (
	annSandbox = "berth.dev/sandbox"
	// labelToken selects a sandbox by its envd token's hash (the hex
	// SHA-256 is 64 characters, one over a label value's limit: LabelValue
	// hashes it again).
	labelToken = "berth.dev/token-hash"
)

// maxRest keeps annSandbox under the API server's 256 KiB for all of an
// object's annotations (others' annotations and the keys need the rest).
const maxRest = 240 << 10

type sandboxRest struct {
	Message         string            `json:"message,omitempty"`
	Env             map[string]string `json:"env,omitempty"`
	AccessTokenHash string            `json:"accessTokenHash,omitempty"`
	PauseRequested  sandbox.PauseMode `json:"pauseRequested,omitempty"`
	ResumedFrom     sandbox.PauseMode `json:"resumedFrom,omitempty"`
	RestoreCount    int               `json:"restoreCount,omitempty"`
	AutoResume      bool              `json:"autoResume,omitempty"`
	// Attrs without Cluster, which spec and status carry.
	Attrs   sandbox.Attrs `json:"attrs"`
	Version int64         `json:"version"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func timeOf(p *time.Time) time.Time {
	if p == nil {
		return time.Time{}
	}
	return *p
}

// ourSandboxLabels are the Kubernetes labels this store sets on a Sandbox
// (others' labels on the object are kept).
var ourSandboxLabels = []string{berthv1.LabelOwner, berthv1.LabelState, berthv1.LabelTemplate, berthv1.LabelNode, labelToken}

// toObject writes sb onto base (the object as read, or a new one), keeping
// base's metadata and the transition times of its conditions.
func (s *Store) toObject(sb *sandbox.Sandbox, base *berthv1.Sandbox) (*berthv1.Sandbox, error) {
	rest := sandboxRest{
		Message: sb.Message, Env: sb.Env, AccessTokenHash: sb.AccessTokenHash,
		PauseRequested: sb.PauseRequested, ResumedFrom: sb.ResumedFrom, RestoreCount: sb.RestoreCount,
		AutoResume: sb.AutoResume, Attrs: sb.Attrs, Version: sb.Version,
	}
	rest.Attrs.Cluster = sandbox.ClusterState{}
	b, err := json.Marshal(rest)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "kubernetes store: encode sandbox %s", sb.ID)
	}
	if len(b) > maxRest {
		return nil, errs.E(errs.ResourceExhausted, "sandbox %s: its env and attributes take %d bytes; a Kubernetes object's annotations hold at most %d",
			sb.ID, len(b), maxRest)
	}
	o := *base
	o.TypeMeta = kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Sandbox"}
	o.Name, o.Namespace = sb.ID, s.ns
	o.Labels = map[string]string{}
	for k, v := range base.Labels {
		if !slices.Contains(ourSandboxLabels, k) {
			o.Labels[k] = v
		}
	}
	o.Labels[berthv1.LabelOwner] = LabelValue(sb.Owner)
	o.Labels[berthv1.LabelState] = LabelValue(string(sb.State))
	o.Labels[berthv1.LabelTemplate] = LabelValue(sb.Template)
	if n := sb.Attrs.Cluster.Node; n != "" {
		o.Labels[berthv1.LabelNode] = LabelValue(n)
	}
	if sb.AccessTokenHash != "" {
		o.Labels[labelToken] = LabelValue(sb.AccessTokenHash)
	}
	o.Annotations = map[string]string{}
	for k, v := range base.Annotations {
		o.Annotations[k] = v
	}
	o.Annotations[annSandbox] = string(b)
	cl := sb.Attrs.Cluster
	o.Spec = berthv1.SandboxSpec{
		Owner: sb.Owner, Template: sb.Template, TemplateFingerprint: sb.TemplateID, Runtime: sb.Runtime,
		Resources: berthv1.Resources{CPUMillis: int64(sb.Resources.CPUMillis), MemoryMiB: sb.Resources.MemoryMiB,
			DiskMiB: sb.Resources.DiskMiB, Pids: sb.Resources.Pids},
		Labels: sb.Labels, ExpiresAt: timePtr(sb.ExpiresAt), ExpiryAction: string(sb.ExpiryAction),
		ExpectedDuration: cl.ExpectedDuration, DurationClass: cl.DurationClass, NodeName: cl.Node,
		// Network stays empty: the policy is egress's JSON (Attrs.Net),
		// not a shape this projection could carry without loss.
	}
	// status.state is exactly the store's state ("pending" while no node
	// is bound: Scheduled=False says why), so reads are lossless and the
	// state label selects what the state says.
	conds := slices.Clone(base.Status.Conditions)
	o.Status = berthv1.SandboxStatus{
		State: string(sb.State), Reason: sb.Reason, PauseMode: string(sb.PauseActual), Node: cl.Node,
		Timings: berthv1.SandboxTimings{CreatedAt: timePtr(sb.CreatedAt), BoundAt: timePtr(cl.BoundAt),
			StartedAt: timePtr(sb.StartedAt), LostAt: timePtr(cl.LostAt)},
		Conditions: s.sandboxConditions(sb, conds),
	}
	return &o, nil
}

// sandboxConditions sets Scheduled, Ready and NodeLost (when bound)
// following the Kubernetes conventions: CamelCase reasons, a transition
// time that moves only when the status does.
func (s *Store) sandboxConditions(sb *sandbox.Sandbox, conds []kube.Condition) []kube.Condition {
	now := s.now().UTC()
	set := func(typ string, ok bool, reason, msg string) {
		st := "False"
		if ok {
			st = "True"
		}
		kube.SetCondition(&conds, kube.Condition{Type: typ, Status: st, Reason: reason, Message: msg, LastTransitionTime: now})
	}
	node := sb.Attrs.Cluster.Node
	switch {
	case node != "":
		set(berthv1.CondScheduled, true, "Bound", "bound to node "+node)
	case sb.State == statePending && sb.Message != "":
		// The scheduler's last word on why nothing fits (placement's
		// message); it writes it only when it changes.
		set(berthv1.CondScheduled, false, "Unschedulable", sb.Message)
	default:
		set(berthv1.CondScheduled, false, "Unschedulable", "not bound to a node")
	}
	msg := sb.Message
	if msg == "" {
		msg = sb.Reason
	}
	set(berthv1.CondReady, sb.State == sandbox.Running, camel(string(sb.State)), msg)
	if node != "" || sb.State == sandbox.Lost {
		if sb.State == sandbox.Lost {
			set(berthv1.CondLost, true, "LeaseExpired", "node "+node+" stopped renewing its lease")
		} else {
			set(berthv1.CondLost, false, "LeaseCurrent", "")
		}
	}
	return conds
}

// camel turns a state ("running") into a condition reason ("Running").
func camel(s string) string {
	if s == "" {
		return "Unknown"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// statePending is an unbound sandbox's state (cluster mode's scheduler
// binds it; internal/sandbox's table has no such state).
const statePending = sandbox.State(berthv1.StatePending)

// SandboxFromObject is fromObject for the cluster's scheduler, which lists
// the objects itself (it needs their metadata too).
func SandboxFromObject(o *berthv1.Sandbox) (*sandbox.Sandbox, error) { return fromObject(o) }

// fromObject reads a Sandbox object back into the store's model.
//
// An object a person wrote (`kubectl apply`, spec only) has no annotation
// and no status: it reads as a pending sandbox created when the API
// server created the object, at Version 0 (the first write makes it 1).
func fromObject(o *berthv1.Sandbox) (*sandbox.Sandbox, error) {
	var rest sandboxRest
	if a, ok := o.Annotations[annSandbox]; ok {
		if err := json.Unmarshal([]byte(a), &rest); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "kubernetes store: sandbox %s: annotation %s", o.Name, annSandbox)
		}
	}
	sp, st := o.Spec, o.Status
	sb := &sandbox.Sandbox{
		ID: o.Name, Owner: sp.Owner, Template: sp.Template, TemplateID: sp.TemplateFingerprint, Runtime: sp.Runtime,
		State: sandbox.State(st.State), Reason: st.Reason, Message: rest.Message, Labels: sp.Labels, Env: rest.Env,
		Resources: sandbox.Resources{CPUMillis: int(sp.Resources.CPUMillis), MemoryMiB: sp.Resources.MemoryMiB,
			DiskMiB: sp.Resources.DiskMiB, Pids: sp.Resources.Pids},
		CreatedAt: timeOf(st.Timings.CreatedAt), StartedAt: timeOf(st.Timings.StartedAt), ExpiresAt: timeOf(sp.ExpiresAt),
		ExpiryAction: sandbox.ExpiryAction(sp.ExpiryAction), AccessTokenHash: rest.AccessTokenHash,
		PauseRequested: rest.PauseRequested, PauseActual: sandbox.PauseMode(st.PauseMode), ResumedFrom: rest.ResumedFrom,
		RestoreCount: rest.RestoreCount, AutoResume: rest.AutoResume, Attrs: rest.Attrs, Version: rest.Version,
	}
	if sb.State == "" {
		sb.State = statePending
	}
	if sb.CreatedAt.IsZero() && o.CreationTimestamp != nil {
		sb.CreatedAt = o.CreationTimestamp.UTC()
	}
	sb.Attrs.Cluster = sandbox.ClusterState{Node: sp.NodeName, ExpectedDuration: sp.ExpectedDuration,
		DurationClass: sp.DurationClass, BoundAt: timeOf(st.Timings.BoundAt), LostAt: timeOf(st.Timings.LostAt)}
	return sb, nil
}

func validSandboxID(id string) error {
	if !sandbox.ValidID(id) {
		return errs.Field("id", "must be 1-64 lowercase letters and digits, got %q", id)
	}
	return nil
}

func sandboxNotFound(id string) error { return errs.E(errs.NotFound, "sandbox %s not found", id) }

// CreateSandbox creates the Sandbox object named sb.ID (Version 1).
func (s *Store) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	if err := validSandboxID(sb.ID); err != nil {
		return err
	}
	rec := *sb
	rec.Version = 1
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = s.now().UTC()
	}
	o, err := s.toObject(&rec, &berthv1.Sandbox{})
	if err != nil {
		return err
	}
	err = s.kc.Create(ctx, berthv1.Sandboxes, s.ns, o, nil)
	if errs.Is(err, errs.AlreadyExists) {
		return errs.E(errs.AlreadyExists, "sandbox %s already exists", sb.ID)
	}
	if err != nil {
		return err
	}
	sb.Version, sb.CreatedAt = rec.Version, rec.CreatedAt
	return nil
}

func (s *Store) getObject(ctx context.Context, id string) (*berthv1.Sandbox, error) {
	if !sandbox.ValidID(id) { // never a path such as ".." in the URL
		return nil, sandboxNotFound(id)
	}
	var o berthv1.Sandbox
	if err := s.kc.Get(ctx, berthv1.Sandboxes, s.ns, id, &o); err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, sandboxNotFound(id)
		}
		return nil, err
	}
	return &o, nil
}

// GetSandbox reads one Sandbox object.
func (s *Store) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	o, err := s.getObject(ctx, id)
	if err != nil {
		return nil, err
	}
	return fromObject(o)
}

// SandboxByTokenHash selects by the token label and compares the hash.
func (s *Store) SandboxByTokenHash(ctx context.Context, hash string) (*sandbox.Sandbox, error) {
	if hash == "" {
		return nil, errs.E(errs.NotFound, "no sandbox has an empty access token")
	}
	sbs, err := s.listSandboxes(ctx, labelToken+"="+LabelValue(hash))
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		if sb.AccessTokenHash == hash {
			return sb, nil
		}
	}
	return nil, errs.E(errs.NotFound, "no sandbox with this access token")
}

// SandboxesOnNode lists the sandboxes bound to node (cluster mode's node
// agent: what it should run), ordered by id.
func (s *Store) SandboxesOnNode(ctx context.Context, node string) ([]*sandbox.Sandbox, error) {
	if node == "" {
		return nil, errs.Field("node", "must not be empty")
	}
	sbs, err := s.listSandboxes(ctx, berthv1.LabelNode+"="+LabelValue(node))
	if err != nil {
		return nil, err
	}
	out := sbs[:0]
	for _, sb := range sbs {
		if sb.Attrs.Cluster.Node == node {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// listSandboxes reads every Sandbox object matching the selector.
func (s *Store) listSandboxes(ctx context.Context, selector string) ([]*sandbox.Sandbox, error) {
	var out []*sandbox.Sandbox
	opts := kube.ListOptions{LabelSelector: selector, Limit: 500}
	for {
		var l berthv1.SandboxList
		if err := s.kc.List(ctx, berthv1.Sandboxes, s.ns, opts, &l); err != nil {
			return nil, err
		}
		for i := range l.Items {
			sb, err := fromObject(&l.Items[i])
			if err != nil {
				return nil, err
			}
			out = append(out, sb)
		}
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

// ListSandboxes selects by labels on the server (owner, states, template)
// and orders and pages here: the API server lists in name order only, so
// the page is cut from the sorted matches by the (created, id) cursor.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*sandbox.Sandbox, string, error) {
	desc := false
	switch f.Order {
	case "", store.OrderAsc:
	case store.OrderDesc:
		desc = true
	default:
		return nil, "", errs.Field("order", "must be %q or %q, got %q", store.OrderAsc, store.OrderDesc, f.Order)
	}
	if f.Limit < 0 {
		return nil, "", errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	var (
		after   bool
		cTime   int64
		cID     string
		matches []string
	)
	if f.After != "" {
		var err error
		if cTime, cID, err = decodeCursor(f.After); err != nil {
			return nil, "", err
		}
		after = true
	}
	if f.Owner != "" {
		matches = append(matches, berthv1.LabelOwner+"="+LabelValue(f.Owner))
	}
	if f.Template != "" {
		matches = append(matches, berthv1.LabelTemplate+"="+LabelValue(f.Template))
	}
	if len(f.States) > 0 {
		vs := make([]string, len(f.States))
		for i, st := range f.States {
			vs[i] = LabelValue(string(st))
		}
		matches = append(matches, berthv1.LabelState+" in ("+strings.Join(vs, ",")+")")
	}
	all, err := s.listSandboxes(ctx, strings.Join(matches, ","))
	if err != nil {
		return nil, "", err
	}
	out := all[:0]
	for _, sb := range all {
		if (f.Owner != "" && sb.Owner != f.Owner) || (f.Template != "" && sb.Template != f.Template) ||
			(len(f.States) > 0 && !slices.Contains(f.States, sb.State)) ||
			(!f.CreatedAfter.IsZero() && !sb.CreatedAt.After(f.CreatedAfter)) || !hasLabels(sb.Labels, f.Labels) ||
			(!f.ExpiresBy.IsZero() && (sb.ExpiresAt.IsZero() || sb.ExpiresAt.After(f.ExpiresBy))) {
			continue
		}
		if after {
			c := cmpKey(sb.CreatedAt.UnixNano(), sb.ID, cTime, cID)
			if (!desc && c <= 0) || (desc && c >= 0) {
				continue
			}
		}
		out = append(out, sb)
	}
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int {
		c := cmpKey(a.CreatedAt.UnixNano(), a.ID, b.CreatedAt.UnixNano(), b.ID)
		if desc {
			return -c
		}
		return c
	})
	var next string
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
		last := out[len(out)-1]
		next = encodeCursor(last.CreatedAt.UnixNano(), last.ID)
	}
	return out, next, nil
}

// backoff waits a random while that grows with the attempts before a
// conflicting write is tried again: writers that lost a race together
// would otherwise all read and write again in step, and mostly lose again.
func backoff(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	d := time.Duration(rand.Int64N(int64(min(attempt, 10)) * int64(time.Millisecond)))
	select {
	case <-ctx.Done():
		return errs.Wrap(errs.Unavailable, ctx.Err(), "kubernetes store: retrying a conflicting write")
	case <-time.After(d):
		return nil
	}
}

func cmpKey(t1 int64, id1 string, t2 int64, id2 string) int {
	switch {
	case t1 < t2:
		return -1
	case t1 > t2:
		return 1
	}
	return strings.Compare(id1, id2)
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// A cursor is the (created, id) of a page's last item, so pages stay
// stable while sandboxes come and go (the same form SQLite's store uses).
func encodeCursor(created int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(created, 10) + "." + id))
}

func decodeCursor(c string) (int64, string, error) {
	bad := errs.Field("after", "is not a cursor returned by a previous page")
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", bad
	}
	ts, id, ok := strings.Cut(string(b), ".")
	created, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || !sandbox.ValidID(id) {
		return 0, "", bad
	}
	return created, id, nil
}

// UpdateSandbox is a read, fn, conditional PUT on the resourceVersion
// read; a Conflict (another writer in between) runs it all again.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	return s.writeSandbox(ctx, id, func(sb *sandbox.Sandbox) error { return fn(sb) })
}

// writeSandbox is UpdateSandbox's loop; change returns fn's error as is.
func (s *Store) writeSandbox(ctx context.Context, id string, change func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	for attempt := 0; ; attempt++ {
		o, err := s.getObject(ctx, id)
		if err != nil {
			return nil, err
		}
		sb, err := fromObject(o)
		if err != nil {
			return nil, err
		}
		read := sb.Version
		if err := change(sb); err != nil {
			return nil, err
		}
		if sb.ID != id {
			return nil, errs.Field("id", "cannot be changed (from %q to %q)", id, sb.ID)
		}
		sb.Version = read + 1
		no, err := s.toObject(sb, o)
		if err != nil {
			return nil, err
		}
		err = s.kc.Update(ctx, berthv1.Sandboxes, s.ns, id, no, nil)
		if errs.Is(err, errs.Conflict) {
			if err := backoff(ctx, attempt); err != nil {
				return nil, err
			}
			continue
		}
		if errs.Is(err, errs.NotFound) {
			return nil, sandboxNotFound(id)
		}
		if err != nil {
			return nil, err
		}
		return sb, nil
	}
}

// DeleteSandbox deletes the object, then every record that goes with it
// (LabelCascade). A delete that finds no object still clears such records,
// so retrying a delete that failed half-way finishes it (and says NotFound).
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if !sandbox.ValidID(id) {
		return sandboxNotFound(id)
	}
	err := s.kc.Delete(ctx, berthv1.Sandboxes, s.ns, id, kube.DeleteOptions{})
	if err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	if cerr := s.kc.DeleteCollection(ctx, berthv1.Records, s.ns,
		kube.ListOptions{LabelSelector: LabelCascade + "=" + LabelValue(id)}); cerr != nil {
		return errs.Wrap(errs.KindOf(cerr), cerr, "kubernetes store: delete the records of sandbox %s", id)
	}
	if errs.Is(err, errs.NotFound) {
		return sandboxNotFound(id)
	}
	return nil
}

// Transition writes the state first and appends the event after: a crash
// in between leaves a state without its event, never an event of a state
// the sandbox never had. If the append fails the new state is returned
// with the error.
func (s *Store) Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var from sandbox.State
	sb, err := s.writeSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		from = sb.State
		if err := sandbox.Transition(from, to); err != nil {
			return err
		}
		if fn != nil {
			if err := fn(sb); err != nil {
				return err
			}
		}
		sb.State = to
		return nil
	})
	if err != nil {
		return nil, err
	}
	ev.SandboxID, ev.Owner, ev.From, ev.To = sb.ID, sb.Owner, from, to
	if ev.Type == "" {
		ev.Type = "transition"
	}
	if _, err := s.appendEvent(ctx, ev, sb); err != nil {
		return sb, errs.Wrap(errs.KindOf(err), err, "sandbox %s is %s; its event was not recorded", id, to)
	}
	return sb, nil
}
