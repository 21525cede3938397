package api

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/placement"
)

// A replica's /metrics is its own work, in the Prometheus text format
// (0.0.4) that the daemon writes by hand too (internal/admission): the
// requests it answered by route and status, how long nodes took to
// answer what it forwarded, its placement decisions and failures, and the
// node losses it marked. What runs on a node (sandboxes, pools, creates'
// latency, usage) is that node's own /metrics, scraped per node. The
// figures are this replica's since it started: a scraper sums replicas.
type replicaMetrics struct {
	mu        sync.Mutex
	requests  map[[2]string]int64 // route, status
	forward   map[string]*histogram
	fwdErrors map[string]int64    // node
	placed    map[[3]string]int64 // node, class, warm|cached|cold
	noFit     map[string]int64    // error kind
	lost      map[[2]string]int64 // what (node|sandbox), node
}

// forwardBounds are the forward-latency buckets, in seconds: a proxied
// request's time until the node's answer header (a create includes the
// node's whole create, hence the long tail).
var forwardBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

type histogram struct {
	buckets []int64
	count   int64
	sum     float64
}

func newReplicaMetrics() *replicaMetrics {
	return &replicaMetrics{requests: map[[2]string]int64{}, forward: map[string]*histogram{}, fwdErrors: map[string]int64{},
		placed: map[[3]string]int64{}, noFit: map[string]int64{}, lost: map[[2]string]int64{}}
}

func (m *replicaMetrics) request(route string, status int) {
	m.mu.Lock()
	m.requests[[2]string{route, strconv.Itoa(status)}]++
	m.mu.Unlock()
}

// forwarded records one request sent to node: its latency until the
// answer's header, or a failure (no answer).
func (m *replicaMetrics) forwarded(node string, d time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.fwdErrors[node]++
		return
	}
	h := m.forward[node]
	if h == nil {
		h = &histogram{buckets: make([]int64, len(forwardBounds))}
		m.forward[node] = h
	}
	s := d.Seconds()
	for i, b := range forwardBounds {
		if s <= b {
			h.buckets[i]++
		}
	}
	h.count++
	h.sum += s
}

func (m *replicaMetrics) placement(dec placement.Decision, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.noFit[errs.KindOf(err).String()]++
		return
	}
	how := "cold"
	switch {
	case dec.WarmHit:
		how = "warm"
	case dec.CacheHit:
		how = "cached"
	}
	m.placed[[3]string{dec.Node, string(dec.Class), how}]++
}

func (m *replicaMetrics) markedLost(what, node string) {
	m.mu.Lock()
	m.lost[[2]string{what, node}]++
	m.mu.Unlock()
}

// write is the exposition, families and samples in a fixed order.
func (m *replicaMetrics) write(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	sample := func(name string, v float64, labels ...string) {
		b.WriteString(name)
		if len(labels) > 0 {
			b.WriteByte('{')
			for i := 0; i+1 < len(labels); i += 2 {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%s=%s", labels[i], strconv.Quote(labels[i+1]))
			}
			b.WriteByte('}')
		}
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		b.WriteByte('\n')
	}
	family("berth_replica_requests_total", "counter", "Requests this replica answered, by route pattern and status.")
	for _, k := range sortedKeys2(m.requests) {
		sample("berth_replica_requests_total", float64(m.requests[k]), "route", k[0], "code", k[1])
	}
	family("berth_replica_forward_seconds", "histogram", "Time from forwarding a request to a node to the node's answer header, by node.")
	for _, node := range slices.Sorted(maps.Keys(m.forward)) {
		h := m.forward[node]
		for i, bound := range forwardBounds {
			sample("berth_replica_forward_seconds_bucket", float64(h.buckets[i]), "node", node, "le", strconv.FormatFloat(bound, 'g', -1, 64))
		}
		sample("berth_replica_forward_seconds_bucket", float64(h.count), "node", node, "le", "+Inf")
		sample("berth_replica_forward_seconds_sum", h.sum, "node", node)
		sample("berth_replica_forward_seconds_count", float64(h.count), "node", node)
	}
	family("berth_replica_forward_errors_total", "counter", "Requests forwarded to a node that got no answer, by node.")
	for _, node := range slices.Sorted(maps.Keys(m.fwdErrors)) {
		sample("berth_replica_forward_errors_total", float64(m.fwdErrors[node]), "node", node)
	}
	family("berth_replica_placements_total", "counter", "Placement decisions, by node, duration class and template locality (warm, cached, cold).")
	keys3 := slices.Collect(maps.Keys(m.placed))
	slices.SortFunc(keys3, func(a, b [3]string) int {
		return strings.Compare(strings.Join(a[:], "\x00"), strings.Join(b[:], "\x00"))
	})
	for _, k := range keys3 {
		sample("berth_replica_placements_total", float64(m.placed[k]), "node", k[0], "class", k[1], "template", k[2])
	}
	family("berth_replica_placement_failures_total", "counter", "Creates that no node could take, by error kind (resource_exhausted: nothing fits).")
	for _, k := range slices.Sorted(maps.Keys(m.noFit)) {
		sample("berth_replica_placement_failures_total", float64(m.noFit[k]), "kind", k)
	}
	family("berth_replica_node_loss_marks_total", "counter", "Node-loss writes this replica made: nodes marked Ready=False (LeaseExpired) and sandboxes moved to lost, by node.")
	for _, k := range sortedKeys2(m.lost) {
		sample("berth_replica_node_loss_marks_total", float64(m.lost[k]), "kind", k[0], "node", k[1])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sortedKeys2[V any](m map[[2]string]V) [][2]string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b [2]string) int {
		if c := strings.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return strings.Compare(a[1], b[1])
	})
	return keys
}

// serveMetrics is GET /metrics: the admin key, as on one host.
func (r *Replica) serveMetrics(w http.ResponseWriter, _ *http.Request, p auth.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "/metrics needs the admin key")
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	return r.metrics.write(w)
}

// countRequests wraps the replica's whole surface: each answer is counted
// under the route pattern that served it (envd and port traffic, routed
// before any mux, under "envd"), so the label set stays bounded.
func (r *Replica) countRequests(next func(w http.ResponseWriter, req *http.Request) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := &httpx.Recorder{ResponseWriter: w}
		route := next(rec, req)
		st := rec.Status
		switch {
		case st == 0 && req.Header.Get("Upgrade") != "":
			st = http.StatusSwitchingProtocols // hijacked: the 101 went on the raw connection
		case st == 0:
			st = http.StatusOK
		}
		r.metrics.request(route, st)
	})
}
