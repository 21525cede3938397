package trace

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/errs"
)

// TestOTLPExporterEnv: the standard variables docs/TRACING.md promises
// (headers, gzip), a busy collector retried, and what a collector decodes:
// parent, kind, status (whose codes differ between the SDK and OTLP) and
// attribute types.
func TestOTLPExporterEnv(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-general=no")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=a%20b,x-other=c")
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	var mu sync.Mutex
	var got []*collectorpb.ExportTraceServiceRequest
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("X-Key") != "a b" || r.Header.Get("X-Other") != "c" || r.Header.Get("X-General") != "" || r.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("headers %v", r.Header)
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		b, _ := io.ReadAll(zr)
		var req collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Error(err)
		}
		got = append(got, &req)
	}))
	defer srv.Close()
	exp, err := newOTLPExporter(srv.URL + "/v1/traces")
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	_, child := tp.Tracer("test").Start(ctx, "child")
	child.SetAttributes(attribute.Int("n", 7), attribute.Bool("b", true), attribute.StringSlice("s", []string{"x", "y"}))
	child.RecordError(errors.New("boom"))
	child.SetStatus(codes.Error, "boom")
	child.End()
	parent.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var spans []*tracepb.Span
	for _, req := range got {
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				if ss.GetScope().GetName() != "test" {
					t.Errorf("scope %q", ss.GetScope().GetName())
				}
				spans = append(spans, ss.GetSpans()...)
			}
		}
	}
	if len(spans) != 2 || spans[0].GetName() != "child" || spans[1].GetName() != "parent" {
		t.Fatalf("spans %v", spans)
	}
	c, p := spans[0], spans[1]
	if string(c.GetParentSpanId()) != string(p.GetSpanId()) || len(p.GetParentSpanId()) != 0 || string(c.GetTraceId()) != string(p.GetTraceId()) {
		t.Errorf("parent links: child parent %x, parent id %x", c.GetParentSpanId(), p.GetSpanId())
	}
	if c.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || p.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_UNSET {
		t.Errorf("status %v / %v", c.GetStatus(), p.GetStatus())
	}
	if c.GetKind() != tracepb.Span_SPAN_KIND_INTERNAL || len(c.GetEvents()) != 1 || c.GetEvents()[0].GetName() != "exception" {
		t.Errorf("kind %v events %v", c.GetKind(), c.GetEvents())
	}
	attrs := map[string]string{}
	for _, kv := range c.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().String()
	}
	if attrs["n"] != "int_value:7" || attrs["b"] != "bool_value:true" || len(c.GetAttributes()) != 3 {
		t.Errorf("attributes %v", attrs)
	}
	if c.GetEndTimeUnixNano() < c.GetStartTimeUnixNano() || c.GetStartTimeUnixNano() == 0 {
		t.Errorf("times %d..%d", c.GetStartTimeUnixNano(), c.GetEndTimeUnixNano())
	}
}

func TestOTLPExporterBadEnv(t *testing.T) {
	for name, v := range map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "soon", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
		"OTEL_EXPORTER_OTLP_HEADERS": "novalue", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent.pem"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, v)
			_, err := newOTLPExporter("http://127.0.0.1:1/v1/traces")
			if errs.KindOf(err) != errs.InvalidArgument || err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: err = %v, want an InvalidArgument naming it", name, v, err)
			}
		})
	}
}
