package node_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/testutil"
)

// blobs reads the Template object's recorded layer blobs.
func blobs(t *testing.T, h *host, name string) map[string]string {
	t.Helper()
	var o berthv1.Template
	if err := h.kc.Get(t.Context(), berthv1.Templates, h.ns, name, &o); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	if err := json.Unmarshal([]byte(o.Annotations[node.AnnLayerBlobs]), &m); err != nil {
		t.Fatalf("annotation %s: %v (%q)", node.AnnLayerBlobs, err, o.Annotations[node.AnnLayerBlobs])
	}
	return m
}

// TestLayerEndpoint attacks the peer layer endpoint: only a request signed
// with the cluster token for an admin principal gets a layer, only a layer
// of the node's templates, and the blob is the one recorded.
func TestLayerEndpoint(t *testing.T) {
	h := startHost(t)
	ctx := t.Context()
	layer := h.tpl.Layers[0]
	want := blobs(t, h, "tiny")[layer]
	if len(want) != 64 {
		t.Fatalf("no blob recorded for layer %s: %v", layer, blobs(t, h, "tiny"))
	}
	hc := &http.Client{Transport: peer.Transport(h.id.SHA256), Timeout: 60 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	get := func(path string, sign func(*http.Request)) (int, []byte) {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.peerURL+path, nil)
		sign(req)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	admin := func(r *http.Request) { peer.Sign(r, h.token, peer.Principal{Admin: true}) }
	for _, c := range []struct {
		name, path string
		sign       func(*http.Request)
		code       int
	}{
		{"unsigned", node.LayersPath + layer, func(*http.Request) {}, 401},
		{"forged token", node.LayersPath + layer, func(r *http.Request) { peer.Sign(r, "not-the-token", peer.Principal{Admin: true}) }, 401},
		{"principal without the token", node.LayersPath + layer, func(r *http.Request) { r.Header.Set(peer.HeaderPrincipal, `{"admin":true}`) }, 401},
		{"owner principal", node.LayersPath + layer, func(r *http.Request) { peer.Sign(r, h.token, peer.Principal{Owner: "mallory"}) }, 403},
		{"unknown digest", node.LayersPath + strings.Repeat("0", 64), admin, 404},
		{"a path", node.LayersPath + "..%2F..%2Fberth.db", admin, 404},
		{"the layer dir's metadata", node.LayersPath + layer + ".json", admin, 404},
	} {
		if code, body := get(c.path, c.sign); code != c.code {
			t.Errorf("%s: HTTP %d, want %d: %s", c.name, code, c.code, body)
		}
	}
	code, body := get(node.LayersPath+layer, admin)
	sum := sha256.Sum256(body)
	if code != 200 || hex.EncodeToString(sum[:]) != want {
		t.Fatalf("signed admin GET: HTTP %d, %d bytes hashing to %x, want the recorded %s", code, len(body), sum, want)
	}
}

// TestLayersFetchedByDigest: a template imported on node na only; a
// Sandbox bound to nb runs there after nb fetched the layer from na, and nb
// then reports the template cached.
func TestLayersFetchedByDigest(t *testing.T) {
	ns := srv.Namespace(t)
	a := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "na"})
	b := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "nb", noTemplate: true})
	layer := a.tpl.Layers[0]
	if b.d.Layers().HasLayer(layer) {
		t.Fatal("nb has the layer before any fetch")
	}
	obj := b.bind(t, "erin")
	b.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	lt, err := b.d.Store().GetTemplate(t.Context(), "tiny")
	if err != nil || lt.Fingerprint != a.tpl.Fingerprint || !slices.Equal(lt.Layers, a.tpl.Layers) {
		t.Fatalf("nb's template %+v (%v), want na's fingerprint %s", lt, err, a.tpl.Fingerprint)
	}
	if !b.d.Layers().HasLayer(layer) {
		t.Fatal("nb runs the sandbox without the layer")
	}
	if sum, _, err := b.d.Layers().BlobDigest(t.Context(), layer); err != nil || sum != blobs(t, a, "tiny")[layer] {
		t.Errorf("nb's copy packs to %s (%v), want the recorded %s", sum, err, blobs(t, a, "tiny")[layer])
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		var n berthv1.Node
		if err := b.kc.Get(t.Context(), berthv1.Nodes, ns, "nb", &n); err != nil {
			return err
		}
		if !slices.Contains(n.Status.CachedTemplates, a.tpl.Fingerprint) {
			return fmt.Errorf("nb's cached templates %v lack %s", n.Status.CachedTemplates, a.tpl.Fingerprint)
		}
		return nil
	})
}

// TestTamperedLayerRefused: na's layer is altered on its disk after it
// recorded the blob; nb refuses what na serves (the object fails naming
// the layer and na) and stores nothing. With a sound copy on nc as well,
// the next sandbox's fetch moves on from na to nc and runs.
func TestTamperedLayerRefused(t *testing.T) {
	ns := srv.Namespace(t)
	a := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "na"})
	layer := a.tpl.Layers[0]
	if err := os.WriteFile(filepath.Join(a.d.Layers().LayerPath(layer), "planted"), []byte("not in the layer"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "nb", noTemplate: true})
	obj := b.bind(t, "erin")
	o := b.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Failed }, "failed")
	if o.Reason != "create_failed" || !strings.Contains(o.Message, layer) || !strings.Contains(o.Message, "from node na") ||
		!strings.Contains(o.Message, "blob hashes to") {
		t.Fatalf("failed object: reason %q message %q; want the layer %s and node na named", o.Reason, o.Message, layer)
	}
	if b.d.Layers().HasLayer(layer) {
		t.Fatal("a refused layer was stored")
	}
	if _, err := b.d.Store().GetTemplate(t.Context(), "tiny"); err == nil {
		t.Fatal("a template was recorded from a refused layer")
	}
	ents, _ := os.ReadDir(b.d.Layers().Dir())
	if len(ents) != 0 {
		t.Fatalf("nb's layer dir after the refusal: %v", ents)
	}

	startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "nc"})
	obj2 := b.bind(t, "erin")
	b.waitObject(t, obj2.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	if !strings.Contains(b.logs.String(), "from=na") {
		t.Errorf("nb's log does not show the refused fetch from na:\n%s", b.logs.String())
	}
}

// TestForwardedCreateFetchesTemplate: a replica's signed create reaching a
// node without the template (the agent's own path held back by a long
// grace) fetches the layers first and answers 201.
func TestForwardedCreateFetchesTemplate(t *testing.T) {
	ns := srv.Namespace(t)
	a := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "na"})
	b := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, ns: ns, name: "nb", noTemplate: true, createGrace: time.Hour})
	ctx := t.Context()
	obj := b.bind(t, "gus")
	hc := &http.Client{Transport: peer.Transport(b.id.SHA256), Timeout: 60 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(ctx, "POST", b.peerURL+"/v1/sandboxes", strings.NewReader(`{"template":"tiny"}`))
	peer.Sign(req, b.token, peer.Principal{Owner: "gus"})
	req.Header.Set(peer.HeaderSandboxID, obj.ID)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("forwarded create on nb: HTTP %d: %s", resp.StatusCode, body)
	}
	b.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	if !b.d.Layers().HasLayer(a.tpl.Layers[0]) {
		t.Fatal("nb runs the sandbox without the layer")
	}
}
