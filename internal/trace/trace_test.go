package trace

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// record installs an SDK provider with an in-memory recorder for one test.
func record(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	uninstall := Install(tp)
	t.Cleanup(func() {
		uninstall()
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

func TestOffIsFree(t *testing.T) {
	if Enabled() {
		t.Fatal("tracing on by default")
	}
	ctx := context.Background()
	got, sp := Phase(ctx, "sandbox.create", String("k", "v"))
	if got != ctx {
		t.Fatal("Phase with tracing off returned a new context")
	}
	if sp != (Span{}) {
		t.Fatal("Phase with tracing off returned a live span")
	}
	sp.Set(Int("n", 1))
	sp.End(errors.New("x"))
	var err error
	sp.EndErr(&err)
	Set(ctx, Bool("b", true))
	Event(ctx, "e")
	Route(ctx, "GET /x")
	if Sandbox(&sandbox.Sandbox{ID: "a"}) != nil {
		t.Fatal("Sandbox attributes computed with tracing off")
	}
	// The middleware is a pass-through: the handler sees the caller's
	// request context, with no span in it.
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if oteltrace.SpanContextFromContext(r.Context()).IsValid() {
			t.Error("a span exists with tracing off")
		}
		w.WriteHeader(http.StatusTeapot)
	}))
	req := httptest.NewRequest("GET", "/v1/x", nil)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, req)
	if rw.Code != http.StatusTeapot {
		t.Fatalf("status %d", rw.Code)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		c, s := Phase(ctx, "x")
		s.End(nil)
		_ = c
	}); allocs != 0 {
		t.Fatalf("Phase with tracing off allocates %v times", allocs)
	}
}

func TestStartWithoutEndpointStartsNothing(t *testing.T) {
	stop, err := Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if Enabled() {
		t.Fatal("Start(\"\") turned tracing on")
	}
	goleak.VerifyNone(t) // no exporter or batcher goroutine
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPhaseTree(t *testing.T) {
	rec := record(t)
	ctx, root := Phase(context.Background(), "sandbox.create", Sandbox(&sandbox.Sandbox{ID: "sb1", Template: "tiny", Runtime: "runc"})...)
	bctx, boot := Phase(ctx, "sandbox.boot")
	if err := Do(bctx, "boot.fs", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	failure := errs.E(errs.Unavailable, "agent did not become ready")
	if err := Do(bctx, "boot.agent_ready", func(context.Context) error { return failure }); err != failure {
		t.Fatalf("Do returned %v", err)
	}
	Event(bctx, "fallback", String("why", "test"))
	boot.End(nil)
	root.Set(Bool("pool.hit", false))
	err := error(nil)
	root.EndErr(&err)

	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	var names []string
	for _, s := range spans {
		byName[s.Name()] = s
		names = append(names, s.Name())
	}
	if d := cmp.Diff([]string{"boot.fs", "boot.agent_ready", "sandbox.boot", "sandbox.create"}, names); d != "" {
		t.Fatalf("end order (-want +got):\n%s", d)
	}
	parent := func(child, want string) {
		t.Helper()
		c, p := byName[child], byName[want]
		if c.Parent().SpanID() != p.SpanContext().SpanID() || c.SpanContext().TraceID() != p.SpanContext().TraceID() {
			t.Errorf("%s is not a child of %s", child, want)
		}
	}
	parent("boot.fs", "sandbox.boot")
	parent("boot.agent_ready", "sandbox.boot")
	parent("sandbox.boot", "sandbox.create")
	if byName["sandbox.create"].Parent().IsValid() {
		t.Error("sandbox.create has a parent")
	}
	attrs := map[string]string{}
	for _, a := range byName["sandbox.create"].Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if d := cmp.Diff(map[string]string{"sandbox.id": "sb1", "sandbox.template": "tiny", "sandbox.runtime": "runc", "pool.hit": "false"}, attrs); d != "" {
		t.Errorf("attributes (-want +got):\n%s", d)
	}
	ready := byName["boot.agent_ready"]
	if ready.Status().Code != codes.Error || !strings.Contains(ready.Status().Description, "agent did not become ready") {
		t.Errorf("failed phase status = %+v", ready.Status())
	}
	var kind string
	for _, a := range ready.Attributes() {
		if a.Key == "error.type" {
			kind = a.Value.AsString()
		}
	}
	if kind != "unavailable" {
		t.Errorf("error.type = %q, want unavailable", kind)
	}
	if byName["boot.fs"].Status().Code == codes.Error || byName["sandbox.create"].Status().Code == codes.Error {
		t.Error("a successful phase is marked failed")
	}
	if ev := byName["sandbox.boot"].Events(); len(ev) != 1 || ev[0].Name != "fallback" {
		t.Errorf("events = %+v", ev)
	}
}

func TestHandler(t *testing.T) {
	rec := record(t)
	var inner oteltrace.SpanContext
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Route(r.Context(), "POST /v1/sandboxes/{id}/exec")
		inner = oteltrace.SpanContextFromContext(r.Context())
		_, sp := Phase(r.Context(), "sandbox.exec")
		sp.End(nil)
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = http.NewResponseController(w).Flush() // exec streams flush through the wrapper
	}))
	const caller = "0af7651916cd43dd8448eb211c80319c"
	for _, tc := range []struct {
		name, traceparent string
		continues         bool
	}{
		{"caller's trace", "00-" + caller + "-b7ad6b7169203331-01", true},
		{"no traceparent", "", false},
		{"malformed traceparent", "00-zz-b7ad6b7169203331-01", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.Reset()
			req := httptest.NewRequest("POST", "/v1/sandboxes/abc/exec", nil)
			if tc.traceparent != "" {
				req.Header.Set("traceparent", tc.traceparent)
			}
			rw := httptest.NewRecorder()
			h.ServeHTTP(rw, req)
			if !rw.Flushed || rw.Code != http.StatusServiceUnavailable {
				t.Fatalf("flushed=%v code=%d", rw.Flushed, rw.Code)
			}
			spans := rec.Ended()
			if len(spans) != 2 {
				t.Fatalf("%d spans", len(spans))
			}
			exec, srv := spans[0], spans[1]
			if srv.Name() != "POST /v1/sandboxes/{id}/exec" || srv.SpanKind() != oteltrace.SpanKindServer {
				t.Errorf("server span %q kind %v", srv.Name(), srv.SpanKind())
			}
			if srv.SpanContext().SpanID() != inner.SpanID() || exec.Parent().SpanID() != inner.SpanID() {
				t.Error("the handler's context does not carry the server span")
			}
			got := srv.SpanContext().TraceID().String() == caller
			if got != tc.continues {
				t.Errorf("continues caller's trace = %v, want %v", got, tc.continues)
			}
			if tc.continues && srv.Parent().SpanID().String() != "b7ad6b7169203331" || !tc.continues && srv.Parent().IsValid() {
				t.Errorf("parent = %v", srv.Parent())
			}
			status := 0
			for _, a := range srv.Attributes() {
				if a.Key == "http.response.status_code" {
					status = int(a.Value.AsInt64())
				}
			}
			if status != http.StatusServiceUnavailable || srv.Status().Code != codes.Error {
				t.Errorf("status attr %d, span status %v", status, srv.Status())
			}
		})
	}
}

func TestLogHandler(t *testing.T) {
	rec := record(t)
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&buf, nil))).With("sandbox_id", "sb1")
	ctx, sp := Phase(context.Background(), "sandbox.create")
	log.InfoContext(ctx, "inside")
	sp.End(nil)
	log.Info("outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	s := rec.Ended()[0].SpanContext()
	if !strings.Contains(lines[0], "trace_id="+s.TraceID().String()) || !strings.Contains(lines[0], "span_id="+s.SpanID().String()) ||
		!strings.Contains(lines[0], "sandbox_id=sb1") {
		t.Errorf("line with a span: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("line without a span: %s", lines[1])
	}
	tid, sid := IDs(ctx)
	if tid != s.TraceID().String() || sid != s.SpanID().String() {
		t.Errorf("IDs = %s %s", tid, sid)
	}
}

func TestEndpoint(t *testing.T) {
	if got := ResolveEndpoint("http://flag:4318", "http://env:4318"); got != "http://flag:4318" {
		t.Errorf("flag does not win: %s", got)
	}
	if got := ResolveEndpoint("", "http://env:4318"); got != "http://env:4318" {
		t.Errorf("env ignored: %s", got)
	}
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"},
		{"http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"},
		{"https://otel.example:443/custom/path", "https://otel.example:443/custom/path"},
		{"127.0.0.1:4318", ""},
		{"ftp://x", ""},
		{"http://", ""},
		{"::", ""},
	} {
		got, err := TracesURL("otlp_endpoint", tc.in)
		if tc.want == "" {
			if err == nil || errs.KindOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "otlp_endpoint") {
				t.Errorf("%q: err = %v, want an invalid otlp_endpoint", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestStartExportsOTLP runs the real exporter against a real HTTP server
// decoding the OTLP protobuf: service.name is berth, and shutdown flushes
// what the batcher still holds (no waiting for its schedule).
func TestStartExportsOTLP(t *testing.T) {
	var mu sync.Mutex
	var got []*collectorpb.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("%s %s %s", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			body = zr
		}
		b, _ := io.ReadAll(io.LimitReader(body, 8<<20))
		var req collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Error(err)
		}
		mu.Lock()
		got = append(got, &req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	defer srv.Close()
	stop, err := Start(context.Background(), srv.URL, String("host.name", "test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, sp := Phase(context.Background(), "sandbox.create")
	_, child := Phase(ctx, "sandbox.boot")
	child.End(nil)
	sp.End(nil)
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if Enabled() {
		t.Fatal("still enabled after shutdown")
	}
	mu.Lock()
	defer mu.Unlock()
	var names []string
	for _, req := range got {
		for _, rs := range req.GetResourceSpans() {
			res := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				res[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			if res["service.name"] != "berth" || res["host.name"] != "test" {
				t.Errorf("resource %v", res)
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}
	if d := cmp.Diff([]string{"sandbox.boot", "sandbox.create"}, names); d != "" {
		t.Errorf("exported spans (-want +got):\n%s", d)
	}
}

// BenchmarkPhase: the cost of one phase span, off and on (a sampling SDK
// provider; export is the batcher's, off this path).
func BenchmarkPhase(b *testing.B) {
	ctx := context.Background()
	b.Run("off", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, sp := Phase(ctx, "boot.fs")
			sp.End(nil)
		}
	})
	b.Run("on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		defer Install(tp)()
		b.ReportAllocs()
		for b.Loop() {
			_, sp := Phase(ctx, "boot.fs", String("sandbox.id", "x"))
			sp.End(nil)
		}
	})
}
