package trace

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/errs"
)

// otlpExporter posts spans to an OTLP/HTTP collector as protobuf
// (POST {endpoint}/v1/traces, application/x-protobuf).
//
// Not otlptracehttp: that module links gRPC, grpc-gateway and
// x/net/trace (7 MB, ~0.8 ms of package initialisers), which every CLI
// call of this one binary paid at start-up, for a POST of one message.
type otlpExporter struct {
	url     string
	hc      *http.Client
	headers http.Header
	gzip    bool

	mu      sync.Mutex
	stopped bool
}

// maxCollectorAnswer bounds how much of a collector's answer is read.
const maxCollectorAnswer = 64 << 10

// newOTLPExporter reads the standard exporter variables docs/TRACING.md
// promises, the traces-specific one winning over the general one:
// OTEL_EXPORTER_OTLP_[TRACES_]HEADERS (k=v,k2=v2, values URL-encoded),
// _TIMEOUT (ms, default 10000), _COMPRESSION (gzip|none), _CERTIFICATE
// (a PEM file of CAs the collector's certificate is checked against).
func newOTLPExporter(url string) (*otlpExporter, error) {
	env := func(name string) (string, string) {
		if v := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_" + name); v != "" {
			return v, "OTEL_EXPORTER_OTLP_TRACES_" + name
		}
		return os.Getenv("OTEL_EXPORTER_OTLP_" + name), "OTEL_EXPORTER_OTLP_" + name
	}
	e := &otlpExporter{url: url, headers: http.Header{}}
	if v, name := env("HEADERS"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			uv, err := neturl.PathUnescape(strings.TrimSpace(val))
			if !ok || k == "" || err != nil {
				return nil, errs.Field(name, "must be key=value pairs separated by commas, got %q", kv)
			}
			e.headers.Set(k, uv)
		}
	}
	timeout := 10 * time.Second
	if v, name := env("TIMEOUT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, errs.Field(name, "must be a positive number of milliseconds, got %q", v)
		}
		timeout = time.Duration(n) * time.Millisecond
	}
	switch v, name := env("COMPRESSION"); v {
	case "gzip":
		e.gzip = true
	case "", "none":
	default:
		return nil, errs.Field(name, "must be gzip or none, got %q", v)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if v, name := env("CERTIFICATE"); v != "" {
		pem, err := os.ReadFile(v)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, err, "%s", name)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errs.Field(name, "%s holds no PEM certificate", v)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	e.hc = &http.Client{Timeout: timeout, Transport: tr}
	return e, nil
}

// retryable answers are retried, as otlptracehttp did: the collector is
// busy or restarting, the spans are not at fault.
func retryable(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	stopped := e.stopped
	e.mu.Unlock()
	if stopped || len(spans) == 0 {
		return nil
	}
	body, err := marshalSpans(spans)
	if err != nil {
		return err
	}
	if e.gzip {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(body)
		if err := zw.Close(); err != nil {
			return err
		}
		body = zb.Bytes()
	}
	// Up to 4 attempts, 0.5 s apart and doubling, within the batcher's ctx.
	wait := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		again, err := e.post(ctx, body)
		if err == nil || !again || attempt == 4 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (e *otlpExporter) post(ctx context.Context, body []byte) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	for k, v := range e.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return true, fmt.Errorf("otlp export: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxCollectorAnswer))
	if resp.StatusCode/100 != 2 {
		return retryable(resp.StatusCode), fmt.Errorf("otlp export: %s answered HTTP %d: %.200s", e.url, resp.StatusCode, b)
	}
	return false, nil
}

func (e *otlpExporter) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	e.hc.CloseIdleConnections()
	return ctx.Err()
}

// marshalSpans encodes an ExportTraceServiceRequest: its only field is
// `repeated ResourceSpans resource_spans = 1`, written here directly so
// that the collector's service package (which imports gRPC) is not linked.
func marshalSpans(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	type scopeKey struct{ name, version, schema string }
	var order []*tracepb.ResourceSpans
	byRes := map[attribute.Distinct]*tracepb.ResourceSpans{}
	byScope := map[*tracepb.ResourceSpans]map[scopeKey]*tracepb.ScopeSpans{}
	for _, s := range spans {
		res := s.Resource()
		rk := res.Equivalent()
		rs := byRes[rk]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(res.Attributes())}, SchemaUrl: res.SchemaURL()}
			byRes[rk] = rs
			byScope[rs] = map[scopeKey]*tracepb.ScopeSpans{}
			order = append(order, rs)
		}
		is := s.InstrumentationScope()
		sk := scopeKey{is.Name, is.Version, is.SchemaURL}
		ss := byScope[rs][sk]
		if ss == nil {
			ss = &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: is.Name, Version: is.Version}, SchemaUrl: is.SchemaURL}
			byScope[rs][sk] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, spanPB(s))
	}
	var out []byte
	for _, rs := range order {
		b, err := proto.Marshal(rs)
		if err != nil {
			return nil, err
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out, nil
}

func spanPB(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId: tid[:], SpanId: sid[:], TraceState: sc.TraceState().String(), Name: s.Name(),
		Kind:              tracepb.Span_SpanKind(s.SpanKind()), // the same numbering: unspecified 0 … consumer 5
		StartTimeUnixNano: unixNano(s.StartTime()), EndTimeUnixNano: unixNano(s.EndTime()),
		Attributes: keyValues(s.Attributes()), DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount: uint32(s.DroppedEvents()), DroppedLinksCount: uint32(s.DroppedLinks()),
		Flags: uint32(sc.TraceFlags()),
	}
	if ps := s.Parent(); ps.IsValid() {
		psid := ps.SpanID()
		p.ParentSpanId = psid[:]
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{TimeUnixNano: unixNano(ev.Time), Name: ev.Name,
			Attributes: keyValues(ev.Attributes), DroppedAttributesCount: uint32(ev.DroppedAttributeCount)})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{TraceId: ltid[:], SpanId: lsid[:], TraceState: l.SpanContext.TraceState().String(),
			Attributes: keyValues(l.Attributes), DroppedAttributesCount: uint32(l.DroppedAttributeCount)})
	}
	// The SDK's codes (unset 0, error 1, ok 2) are not OTLP's (unset 0, ok 1, error 2).
	st := s.Status()
	p.Status = &tracepb.Status{Message: st.Description}
	switch st.Code {
	case codes.Error:
		p.Status.Code = tracepb.Status_STATUS_CODE_ERROR
	case codes.Ok:
		p.Status.Code = tracepb.Status_STATUS_CODE_OK
	}
	return p
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

func keyValues(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), func(b bool) *commonpb.AnyValue { return anyValue(attribute.BoolValue(b)) })
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), func(i int64) *commonpb.AnyValue { return anyValue(attribute.Int64Value(i)) })
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), func(f float64) *commonpb.AnyValue { return anyValue(attribute.Float64Value(f)) })
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), func(s string) *commonpb.AnyValue { return anyValue(attribute.StringValue(s)) })
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.Emit()}}
}

func array[T any](xs []T, f func(T) *commonpb.AnyValue) *commonpb.AnyValue {
	vals := make([]*commonpb.AnyValue, 0, len(xs))
	for _, x := range xs {
		vals = append(vals, f(x))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vals}}}
}

var _ sdktrace.SpanExporter = (*otlpExporter)(nil)
