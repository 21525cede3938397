package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an in-test OTLP/HTTP trace collector: a real HTTP server
// decoding the OTLP protobuf export requests berth sends.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	requests int
	spans    []span
	errs     []string
}

// span is one received span, flattened for assertions.
type span struct {
	trace, id, parent string
	name              string
	server            bool
	attrs             map[string]string
	failed            bool
	resource          map[string]string
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(c.export))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) export(w http.ResponseWriter, r *http.Request) {
	fail := func(f string, a ...any) {
		c.mu.Lock()
		c.errs = append(c.errs, fmt.Sprintf(f, a...))
		c.mu.Unlock()
		http.Error(w, "bad request", http.StatusBadRequest)
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		fail("%s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			fail("gzip: %v", err)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 32<<20))
	if err != nil {
		fail("read: %v", err)
		return
	}
	var req collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		fail("decode: %v", err)
		return
	}
	c.mu.Lock()
	c.requests++
	for _, rs := range req.GetResourceSpans() {
		res := kvs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, span{
					trace: hex.EncodeToString(s.GetTraceId()), id: hex.EncodeToString(s.GetSpanId()),
					parent: hex.EncodeToString(s.GetParentSpanId()), name: s.GetName(),
					server: s.GetKind() == tracepb.Span_SPAN_KIND_SERVER, attrs: kvs(s.GetAttributes()),
					failed: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR, resource: res,
				})
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func kvs(in []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range in {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
		default:
			m[kv.GetKey()] = fmt.Sprint(kv.GetValue())
		}
	}
	return m
}

// received returns what arrived so far.
func (c *collector) received() (int, []span, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, slices.Clone(c.spans), slices.Clone(c.errs)
}

// tracedCall calls the REST API with an optional traceparent and returns
// the status and the whole body (an exec's NDJSON is read to its end).
func (s *server) tracedCall(traceparent, method, path string, body any) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	req.Header.Set("X-API-Key", s.key)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		s.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, b
}

// spanTree indexes the received spans for the assertions below.
type spanTree struct {
	t     *testing.T
	spans []span
	byID  map[string]span
}

func newSpanTree(t *testing.T, spans []span) *spanTree {
	tr := &spanTree{t: t, spans: spans, byID: map[string]span{}}
	for _, s := range spans {
		tr.byID[s.id] = s
	}
	return tr
}

// request is the server span of the only request named name whose
// sandbox-level child has attribute key=value ("" matches any).
func (tr *spanTree) request(name, child, key, value string) span {
	tr.t.Helper()
	var found []span
	for _, s := range tr.spans {
		if s.server && s.name == name {
			for _, c := range tr.children(s, child) {
				if key == "" || c.attrs[key] == value {
					found = append(found, s)
					break
				}
			}
		}
	}
	if len(found) != 1 {
		tr.t.Fatalf("%d %q requests with a %s child where %s=%s; want 1", len(found), name, child, key, value)
	}
	return found[0]
}

func (tr *spanTree) children(parent span, name string) []span {
	var out []span
	for _, s := range tr.spans {
		if s.parent == parent.id && s.trace == parent.trace && (name == "" || s.name == name) {
			out = append(out, s)
		}
	}
	return out
}

// child is parent's only child called name.
func (tr *spanTree) child(parent span, name string) span {
	tr.t.Helper()
	c := tr.children(parent, name)
	if len(c) != 1 {
		var names []string
		for _, s := range tr.children(parent, "") {
			names = append(names, s.name)
		}
		tr.t.Fatalf("%s has %d children called %s; its children: %v", parent.name, len(c), name, names)
	}
	return c[0]
}

// has asserts parent has a child of each name (in any order) and returns them.
func (tr *spanTree) has(parent span, names ...string) []span {
	tr.t.Helper()
	var out []span
	for _, n := range names {
		out = append(out, tr.child(parent, n))
	}
	return out
}

func wantAttrs(t *testing.T, s span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := s.attrs[k]; got != v {
			t.Errorf("%s: %s = %q, want %q (attributes %v)", s.name, k, got, v, s.attrs)
		}
	}
}

// str and num are attribute values as kvs keeps them.
func str(v string) string { return v }
func num(v int) string    { return strconv.Itoa(v) }

// TestTracesOTLP: a real `berth serve --otlp-endpoint` with real runc
// sandboxes exports, to an in-test OTLP/HTTP collector, one trace per
// request with a span per phase of create, exec, pause (freeze and disk),
// resume (thaw and cold boot) and fork; a caller's traceparent is
// continued; the daemon's log lines carry the trace id of the request they
// served; the spans still queued at shutdown are flushed.
func TestTracesOTLP(t *testing.T) {
	col := newCollector(t)
	// No schedule override: what arrives after the last request was
	// flushed by the shutdown (the batcher's own delay is 5 s).
	s := startServer(t, "--otlp-endpoint", col.URL)

	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	_, body := s.tracedCall("00-"+callerTrace+"-"+callerSpan+"-01", "POST", "/v1/sandboxes", map[string]any{"template": "tiny", "runtime": "runc"})
	var created struct{ ID string }
	if err := json.Unmarshal(body, &created); err != nil || created.ID == "" {
		t.Fatalf("create: %v %s", err, body)
	}
	id := created.ID
	_, out := s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"sh", "-c", "echo hi; exit 3"}})
	if !strings.Contains(string(out), `"exit_code":3`) {
		t.Fatalf("exec stream: %s", out)
	}
	s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/pause", map[string]any{"mode": "freeze"})
	s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/resume", nil)
	s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/pause", map[string]any{"mode": "disk"})
	s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/resume", nil)
	_, fb := s.tracedCall("", "POST", "/v1/sandboxes/"+id+"/fork", map[string]any{"count": 2})
	var fork forkResult
	if err := json.Unmarshal(fb, &fork); err != nil || len(fork.Sandboxes) != 2 {
		t.Fatalf("fork: %v %s", err, fb)
	}
	t.Logf("fork_mode %s %s", fork.Mode, fork.Reason)
	for _, sb := range append([]string{id}, fork.Sandboxes[0].ID, fork.Sandboxes[1].ID) {
		s.must("rm", "-f", sb)
	}
	s.stop() // SIGTERM: the daemon flushes its spans on the way out
	logs := s.logs()

	n, spans, errs := col.received()
	if len(errs) > 0 {
		t.Fatalf("collector refused exports: %v", errs)
	}
	t.Logf("%d spans in %d OTLP requests", len(spans), n)
	tr := newSpanTree(t, spans)

	// Every span: service.name berth, and a parent that is a received span
	// of the same trace — except request spans, which are roots or (the
	// create) the caller's span. One server span per trace: one trace per
	// request.
	servers := map[string][]string{}
	for _, sp := range spans {
		if sp.resource["service.name"] != str("berth") {
			t.Errorf("%s: resource %v", sp.name, sp.resource)
		}
		if sp.server {
			servers[sp.trace] = append(servers[sp.trace], sp.name)
			if sp.parent != "" && !(sp.trace == callerTrace && sp.parent == callerSpan) {
				t.Errorf("request span %s has parent %s", sp.name, sp.parent)
			}
			continue
		}
		if p, ok := tr.byID[sp.parent]; !ok || p.trace != sp.trace {
			t.Errorf("span %s (trace %s) has no parent among the received spans", sp.name, sp.trace)
		}
	}
	for tid, names := range servers {
		if len(names) != 1 {
			t.Errorf("trace %s holds %d requests: %v", tid, len(names), names)
		}
	}
	if len(servers) < 8 {
		t.Errorf("%d traces, want one per request (8 or more): %v", len(servers), servers)
	}

	// create: the caller's trace continued; sandbox attributes; a span per boot phase.
	create := tr.request("POST /v1/sandboxes", "sandbox.create", "sandbox.id", str(id))
	if create.trace != callerTrace || create.parent != callerSpan {
		t.Errorf("create request span: trace %s parent %s; want the caller's %s/%s", create.trace, create.parent, callerTrace, callerSpan)
	}
	wantAttrs(t, create, map[string]string{"http.route": str("POST /v1/sandboxes"), "http.response.status_code": num(201)})
	sc := tr.child(create, "sandbox.create")
	wantAttrs(t, sc, map[string]string{"sandbox.id": str(id), "sandbox.template": str("tiny"), "sandbox.runtime": str("runc")})
	boot := tr.child(sc, "sandbox.boot")
	tr.has(boot, "boot.fs", "boot.net", "boot.runtime", "boot.agent_ready")

	// The daemon's "sandbox created" line carries the create's trace id.
	var createdLine string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "sandbox created") && strings.Contains(l, "sandbox_id="+id) {
			createdLine = l
		}
	}
	if !strings.Contains(createdLine, "trace_id="+callerTrace) || !strings.Contains(createdLine, "span_id="+sc.id) {
		t.Errorf("log line of the create lacks its trace: %q", createdLine)
	}

	// exec: a trace of its own, the exit code on the exec span.
	exec := tr.request("POST /v1/sandboxes/{id}/exec", "sandbox.exec", "sandbox.id", str(id))
	if exec.trace == callerTrace || exec.parent != "" {
		t.Errorf("exec request joined another trace: %s parent %q", exec.trace, exec.parent)
	}
	se := tr.child(exec, "sandbox.exec")
	wantAttrs(t, se, map[string]string{"process.exit_code": num(3)})
	tr.child(se, "exec.start")

	// pause freeze → resume thaw; pause disk → resume with a cold boot.
	freeze := tr.child(tr.request("POST /v1/sandboxes/{id}/pause", "sandbox.pause", "pause.requested", str("freeze")), "sandbox.pause")
	wantAttrs(t, freeze, map[string]string{"sandbox.id": str(id), "sandbox.runtime": str("runc"), "pause.actual": str("freeze")})
	tr.child(freeze, "pause.freeze")
	disk := tr.child(tr.request("POST /v1/sandboxes/{id}/pause", "sandbox.pause", "pause.requested", str("disk")), "sandbox.pause")
	wantAttrs(t, disk, map[string]string{"pause.actual": str("disk")})
	tr.child(disk, "pause.disk")
	thaw := tr.child(tr.request("POST /v1/sandboxes/{id}/resume", "sandbox.resume", "resume.from", str("freeze")), "sandbox.resume")
	tr.child(thaw, "resume.thaw")
	cold := tr.child(tr.request("POST /v1/sandboxes/{id}/resume", "sandbox.resume", "resume.from", str("disk")), "sandbox.resume")
	tr.has(tr.child(tr.child(cold, "resume.boot"), "sandbox.boot"), "boot.fs", "boot.net", "boot.runtime", "boot.agent_ready")

	// fork: the capture, then a span per child with its restore (memory) or boot (disk).
	fk := tr.child(tr.request("POST /v1/sandboxes/{id}/fork", "sandbox.fork", "sandbox.id", str(id)), "sandbox.fork")
	wantAttrs(t, fk, map[string]string{"fork.count": num(2), "fork.mode": str(fork.Mode), "fork.snapshot": str(fork.Snapshot)})
	capture := tr.child(fk, "fork.capture")
	children := tr.children(fk, "fork.child")
	if len(children) != 2 {
		t.Fatalf("%d fork.child spans, want 2", len(children))
	}
	var childIDs []string
	for _, c := range children {
		childIDs = append(childIDs, c.attrs["sandbox.id"])
		if fork.Mode == "memory" {
			tr.child(c, "fork.restore")
		} else {
			tr.child(tr.child(c, "sandbox.create"), "sandbox.boot")
		}
	}
	slices.Sort(childIDs)
	want := []string{str(fork.Sandboxes[0].ID), str(fork.Sandboxes[1].ID)}
	slices.Sort(want)
	if !slices.Equal(childIDs, want) {
		t.Errorf("fork.child sandbox ids %v, want %v", childIDs, want)
	}
	if fork.Mode == "memory" {
		tr.has(capture, "fork.checkpoint", "fork.restore_parent")
	}
	for _, sp := range spans {
		if sp.failed && sp.name != "fork.restore" { // a child restore may fall back to a boot, and says so
			t.Errorf("span %s failed: %v", sp.name, sp.attrs)
		}
	}
}

// TestTracesOff: with no --otlp-endpoint (and no OTEL_EXPORTER_OTLP_ENDPOINT)
// nothing is sent — not even to the traces endpoint the standard exporter
// variables point at — a caller's traceparent does not make the daemon
// trace, and its log lines carry no trace id.
func TestTracesOff(t *testing.T) {
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	// An exporter, had one been built, would post here.
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", col.URL+"/v1/traces")
	s := startServer(t)
	_, body := s.tracedCall("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "POST", "/v1/sandboxes", map[string]any{"template": "tiny"})
	var created struct{ ID string }
	_ = json.Unmarshal(body, &created)
	s.tracedCall("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "POST", "/v1/sandboxes/"+created.ID+"/exec", map[string]any{"cmd": []string{"true"}})
	s.must("rm", "-f", created.ID)
	s.stop()
	if n, spans, _ := col.received(); n != 0 || len(spans) != 0 {
		t.Errorf("tracing off, yet %d exports with %d spans arrived", n, len(spans))
	}
	sc := bufio.NewScanner(strings.NewReader(s.logs()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "trace_id=") {
			t.Errorf("log line with a trace id while tracing is off: %s", sc.Text())
		}
		if strings.Contains(sc.Text(), "tracing enabled") {
			t.Errorf("daemon says tracing is on: %s", sc.Text())
		}
	}
}
