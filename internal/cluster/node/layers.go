package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// Layers move between nodes as blobs (template.Store.WriteBlob: the
// layer's canonical tar). The first node to publish a template records
// each layer's blob sha256 in the Template object's annotation AnnLayerBlobs
// (a JSON map layer digest → blob sha256, first writer wins per layer); a
// node that fetches a layer verifies the stream against it, so a blob
// altered on the serving node's disk or on the way is refused.
const (
	AnnLayerBlobs = "berth.dev/layer-blobs"
	// LayersPath is the peer endpoint: GET LayersPath + digest.
	LayersPath = "/v1/cluster/layers/"
	// MaxBlobBytes bounds one fetched layer.
	MaxBlobBytes = 32 << 30
)

// PeerHandler is the node's peer surface: the layer endpoint, then next
// (serve's routes behind auth's ClusterGate).
func PeerHandler(d *daemon.Daemon, token string, next http.Handler) http.Handler {
	lh := LayerHandler(d, token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, LayersPath) {
			lh.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LayerHandler serves GET /v1/cluster/layers/{digest}: only to a request
// signed with the cluster token for an admin principal (another node), and
// only a layer of one of this node's ready templates. The path is never
// built from the request: the digest is looked up among the templates'
// layers and the stored string is what is opened.
func LayerHandler(d *daemon.Daemon, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(code int, kind, msg string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": kind, "message": msg})
		}
		p, ok, err := peer.Verify(r, token)
		switch {
		case err != nil:
			fail(http.StatusUnauthorized, "unauthenticated", errs.Short(err))
			return
		case !ok:
			fail(http.StatusUnauthorized, "unauthenticated", "layers are served to the cluster's nodes only (a signed request)")
			return
		case !p.Admin:
			fail(http.StatusForbidden, "permission_denied", "layers are served to an admin principal only")
			return
		case r.Method != http.MethodGet:
			w.Header().Set("Allow", "GET")
			fail(http.StatusMethodNotAllowed, "invalid_argument", "method must be GET")
			return
		}
		want := strings.TrimPrefix(r.URL.Path, LayersPath)
		digest, err := localLayer(r.Context(), d, want)
		if err != nil {
			fail(http.StatusNotFound, "not_found", errs.Short(err))
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		// Once the body has started, an error can only cut the stream: the
		// receiver's hash check refuses what it got.
		if err := d.Layers().WriteBlob(r.Context(), w, digest); err != nil {
			d.Log().Warn("serve layer", "digest", digest, "err", err)
			panic(http.ErrAbortHandler)
		}
	})
}

// localLayer is the stored digest equal to want among the layers of this
// node's ready templates (NotFound otherwise).
func localLayer(ctx context.Context, d *daemon.Daemon, want string) (string, error) {
	tpls, err := d.Store().ListTemplates(ctx)
	if err != nil {
		return "", err
	}
	for _, t := range tpls {
		if t.State != store.TemplateReady {
			continue
		}
		for _, l := range t.Layers {
			if l == want && d.Layers().HasLayer(l) {
				return l, nil
			}
		}
	}
	return "", errs.E(errs.NotFound, "layer %.80q is not a layer of this node's templates", want)
}

// templateObject reads the Template object of template name (berth's
// name is the object's spec.name; the object name may be a hashed form).
func (a *Agent) templateObject(ctx context.Context, name string) (*berthv1.Template, error) {
	var l berthv1.TemplateList
	if err := a.cfg.Kube.List(ctx, berthv1.Templates, a.cfg.Namespace, kube.ListOptions{}, &l); err != nil {
		return nil, err
	}
	for i := range l.Items {
		if l.Items[i].Spec.Name == name {
			return &l.Items[i], nil
		}
	}
	return nil, errs.E(errs.NotFound, "template %s has no Template object", name)
}

func layerBlobs(o *berthv1.Template) map[string]string {
	m := map[string]string{}
	if v := o.Annotations[AnnLayerBlobs]; v != "" {
		_ = json.Unmarshal([]byte(v), &m) // a garbled annotation: no layer verifiable, none fetched
	}
	return m
}

// recordBlobs adds this node's blob digests of t's layers to t's object for
// the layers it does not list yet (a merge patch on resourceVersion, so
// two nodes publishing at once do not overwrite each other). A layer
// already listed is not packed again: publishing must not read every
// layer at each start. A copy here that packs differently is found by a
// fetching peer, which refuses it and moves on to another node.
func (a *Agent) recordBlobs(ctx context.Context, t store.Template) error {
	for attempt := 0; attempt < 3; attempt++ {
		o, err := a.templateObject(ctx, t.Name)
		if err != nil {
			return err
		}
		m := layerBlobs(o)
		added := false
		for _, l := range t.Layers {
			if _, ok := m[l]; ok {
				continue
			}
			sum, _, err := a.cfg.Daemon.Layers().BlobDigest(ctx, l)
			if err != nil {
				return err
			}
			m[l], added = sum, true
		}
		if !added {
			return nil
		}
		v, _ := json.Marshal(m)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": o.ResourceVersion,
			"annotations": map[string]string{AnnLayerBlobs: string(v)}}})
		err = a.cfg.Kube.Patch(ctx, berthv1.Templates, a.cfg.Namespace, o.Name, kube.MergePatch, patch, "", nil)
		if !errs.Is(err, errs.Conflict) {
			return err
		}
	}
	return errs.E(errs.Conflict, "template %s: layer blobs: too many conflicting writes", t.Name)
}

// ensureTemplate makes template name, as its Template object defines it,
// ready here: nothing when a ready local template has its fingerprint;
// else each missing layer is fetched by digest from a node that caches
// the template, then the template is recorded locally.
func (a *Agent) ensureTemplate(ctx context.Context, name string) error {
	// One fetch per template at a time (a forwarded create, the agent's
	// create and a warm pool may all want it): the others wait and find it.
	a.mu.Lock()
	mu := a.fetching[name]
	if mu == nil {
		mu = &sync.Mutex{}
		a.fetching[name] = mu
	}
	a.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	o, err := a.templateObject(ctx, name)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil // not the cluster's: the daemon's create says what is missing
		}
		return err
	}
	fp := o.Status.Fingerprint
	if lt, err := a.cfg.Daemon.Store().GetTemplate(ctx, name); err == nil && lt.State == store.TemplateReady && lt.Fingerprint == fp {
		return nil
	}
	want, err := a.cfg.Cluster.GetTemplate(ctx, name)
	if err != nil {
		return err
	}
	if len(want.Layers) == 0 || template.FingerprintOf(want) != fp {
		return errs.E(errs.FailedPrecondition, "template %s: its object's fingerprint %q does not match its layers and defaults", name, fp)
	}
	blobs := layerBlobs(o)
	layers := a.cfg.Daemon.Layers()
	var missing []string
	for _, l := range want.Layers {
		if err := template.ValidateDigest(l); err != nil {
			return errs.Wrap(errs.FailedPrecondition, err, "template %s", name)
		}
		if !layers.HasLayer(l) {
			if blobs[l] == "" {
				return errs.E(errs.FailedPrecondition, "template %s: layer %s has no recorded blob digest (annotation %s)", name, l, AnnLayerBlobs)
			}
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		srcs, err := a.sources(ctx, fp)
		if err != nil {
			return err
		}
		if len(srcs) == 0 {
			return errs.E(errs.Unavailable, "template %s (%s): no other ready node caches it", name, fp)
		}
		for _, l := range missing {
			if err := a.fetchLayer(ctx, l, blobs[l], srcs); err != nil {
				return errs.Wrap(errs.KindOf(err), err, "template %s", name)
			}
		}
	}
	want.State, want.Progress, want.Error = store.TemplateReady, "", ""
	want.Source = "cluster " + want.Source
	want.CreatedAt, want.UpdatedAt = time.Time{}, time.Time{}
	if _, err := a.cfg.Daemon.Store().PutTemplate(ctx, want); err != nil {
		return err
	}
	a.log.Info("template fetched from the cluster", "template", name, "fingerprint", fp, "layers_fetched", len(missing))
	return nil
}

// source is a node that caches a template.
type source struct{ name, address, cert string }

// sources are the other nodes, ready and reporting fingerprint fp cached.
func (a *Agent) sources(ctx context.Context, fp string) ([]source, error) {
	var l berthv1.NodeList
	if err := a.cfg.Kube.List(ctx, berthv1.Nodes, a.cfg.Namespace, kube.ListOptions{}, &l); err != nil {
		return nil, err
	}
	var out []source
	for _, n := range l.Items {
		st := n.Status
		if n.Name == a.cfg.Name || !slices.Contains(st.CachedTemplates, fp) || st.Address == "" || len(st.CertSHA256) != 64 {
			continue
		}
		if c := findCond(st.Conditions, berthv1.CondNodeReady); c != nil && c.Status != "True" {
			continue
		}
		out = append(out, source{n.Name, st.Address, st.CertSHA256})
	}
	return out, nil
}

func findCond(cs []kube.Condition, typ string) *kube.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// fetchLayer imports layer digest from the first source that serves a
// blob hashing to blob; a failed or refused fetch moves to the next one.
func (a *Agent) fetchLayer(ctx context.Context, digest, blob string, srcs []source) error {
	var errsAll []error
	for _, s := range srcs {
		err := a.fetchFrom(ctx, digest, blob, s)
		if err == nil {
			return nil
		}
		a.log.Warn("fetch layer", "layer", digest, "from", s.name, "err", err)
		errsAll = append(errsAll, fmt.Errorf("from node %s: %w", s.name, err))
	}
	err := errors.Join(errsAll...)
	kind := errs.Unavailable
	if len(errsAll) == 1 {
		kind = errs.KindOf(errsAll[0])
	}
	return errs.Wrap(kind, err, "fetch layer %s", digest)
}

func (a *Agent) fetchFrom(ctx context.Context, digest, blob string, s source) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(s.address, "/")+LayersPath+digest, nil)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "node %s address %q", s.name, s.address)
	}
	peer.Sign(req, a.cfg.Daemon.Config().ClusterToken, peer.Principal{Admin: true})
	tr := peer.Transport(s.cert)
	defer tr.CloseIdleConnections() // one transport per fetch: its connection ends with it
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return errs.Wrap(errs.Unavailable, err, "request")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errs.E(errs.Unavailable, "HTTP %d", resp.StatusCode)
	}
	_, err = a.cfg.Daemon.Layers().ImportBlob(ctx, digest, blob, resp.Body, MaxBlobBytes)
	return err // names the layer, and what the blob hashed to
}

// publish puts t as its Template object and records its layers' blobs.
func (a *Agent) publish(ctx context.Context, t store.Template) error {
	if _, err := a.cfg.Cluster.PutTemplate(ctx, t); err != nil {
		return err
	}
	return a.recordBlobs(ctx, t)
}
