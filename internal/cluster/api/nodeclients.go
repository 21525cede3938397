package api

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
)

// nodeTTL is how long a Node object read for a request is reused. The
// loss loop refreshes every node each second anyway; this bounds the
// staleness of an address or certificate hash that changed.
const nodeTTL = 2 * time.Second

// nodeClients finds a node's peer endpoint and keeps one pinned transport
// per (node, certificate hash): a node that comes back with a new
// certificate gets a new transport, and the old one's idle connections
// are closed.
type nodeClients struct {
	kc *kube.Client
	ns string

	mu         sync.Mutex // guards the maps
	nodes      map[string]cachedNode
	transports map[string]*pinned
}

type cachedNode struct {
	node *berthv1.Node
	at   time.Time
}

type pinned struct {
	hash string
	tr   *http.Transport
}

func newNodeClients(kc *kube.Client, ns string) *nodeClients {
	return &nodeClients{kc: kc, ns: ns, nodes: map[string]cachedNode{}, transports: map[string]*pinned{}}
}

// node returns the Node object name, from the cache when fresh.
func (c *nodeClients) node(ctx context.Context, name string) (*berthv1.Node, error) {
	c.mu.Lock()
	cn, ok := c.nodes[name]
	c.mu.Unlock()
	if ok && time.Since(cn.at) < nodeTTL {
		return cn.node, nil
	}
	var n berthv1.Node
	if err := c.kc.Get(ctx, berthv1.Nodes, c.ns, name, &n); err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, errs.E(errs.Unavailable, "node %s is not registered (no Node object)", name)
		}
		return nil, err
	}
	c.put([]berthv1.Node{n})
	return &n, nil
}

// put refreshes the cache with nodes just listed.
func (c *nodeClients) put(nodes []berthv1.Node) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range nodes {
		n := nodes[i]
		c.nodes[n.Name] = cachedNode{node: &n, at: now}
	}
}

// endpoint is where to send a request for node name: its peer base URL
// and a transport pinning its certificate.
func (c *nodeClients) endpoint(ctx context.Context, name string) (*url.URL, http.RoundTripper, error) {
	n, err := c.node(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(n.Status.Address)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, errs.E(errs.Unavailable, "node %s publishes no usable peer address (%q)", name, n.Status.Address)
	}
	if len(n.Status.CertSHA256) != 64 {
		return nil, nil, errs.E(errs.Unavailable, "node %s publishes no certificate hash", name)
	}
	return u, c.transport(name, n.Status.CertSHA256), nil
}

func (c *nodeClients) transport(name, hash string) *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.transports[name]
	if p != nil && p.hash == hash {
		return p.tr
	}
	if p != nil {
		p.tr.CloseIdleConnections()
	}
	p = &pinned{hash: hash, tr: peer.Transport(hash)}
	c.transports[name] = p
	return p.tr
}

// close drops every idle connection (shutdown, tests' leak checks).
func (c *nodeClients) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.transports {
		p.tr.CloseIdleConnections()
	}
}
