// Package trace owns berth's OpenTelemetry tracing: the tracer provider
// (installed once by `berth serve` when an OTLP endpoint is configured,
// otherwise none), the span of every REST request (continuing a caller's
// W3C traceparent), the one helper the lifecycle code calls to mark a
// phase (Phase), and the slog handler that stamps trace_id/span_id on log
// records whose context carries a span.
//
// Off is the default and costs nothing measurable: with no provider
// installed Phase returns its context unchanged and a zero Span whose
// methods do nothing; no exporter, batcher or goroutine exists.
//
// Span names and attributes are listed in docs/TRACING.md; a new phase is
// one `ctx, sp := trace.Phase(ctx, "area.phase")` plus `sp.End(err)`.
package trace

import (
	"context"
	"errors"
	"net/url"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// ServiceName is the service.name resource attribute of every span.
const ServiceName = "berth"

// EnvEndpoint is the standard OTLP variable berth honours when no
// --otlp-endpoint is given.
const EnvEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"

// provider is what Install set; nil means tracing is off.
type provider struct {
	tracer oteltrace.Tracer
}

var active atomic.Pointer[provider]

// propagator reads and writes W3C trace context (traceparent/tracestate).
var propagator = propagation.TraceContext{}

// Enabled reports whether a tracer provider is installed.
func Enabled() bool { return active.Load() != nil }

// ResolveEndpoint picks the OTLP endpoint: the flag (or config) wins over
// the environment; "" means tracing is off.
func ResolveEndpoint(flag, env string) string {
	if flag != "" {
		return flag
	}
	return env
}

// TracesURL turns an OTLP/HTTP endpoint into the URL spans are posted to:
// a base URL (no path, or "/") gets the standard /v1/traces appended, as
// OTEL_EXPORTER_OTLP_ENDPOINT does; a URL with a path is used as given.
// field names the config key in the error.
func TracesURL(field, endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errs.Field(field, "must be an http:// or https:// URL of an OTLP/HTTP collector (e.g. http://127.0.0.1:4318), got %q", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Start installs an OTLP/HTTP exporter posting to endpoint (see TracesURL)
// behind a batching span processor. endpoint "" leaves tracing off and
// starts nothing. The returned shutdown flushes the spans still queued
// and uninstalls the provider; call it once, on the daemon's way out.
func Start(ctx context.Context, endpoint string, attrs ...attribute.KeyValue) (shutdown func(context.Context) error, err error) {
	if endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	u, err := TracesURL("otlp_endpoint", endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := newOTLPExporter(u) // otlp.go
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(append([]attribute.KeyValue{attribute.String("service.name", ServiceName)}, attrs...)...))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "trace resource")
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	uninstall := Install(tp)
	return func(ctx context.Context) error {
		uninstall()
		return tp.Shutdown(ctx) // flushes the batcher, then stops the exporter
	}, nil
}

// Install makes tp the provider of every span berth starts and returns the
// function that turns tracing off again. Start calls it; tests install an
// SDK provider with an in-memory exporter.
func Install(tp oteltrace.TracerProvider) (uninstall func()) {
	p := &provider{tracer: tp.Tracer("github.com/berth-dev/berth")}
	active.Store(p)
	return func() { active.CompareAndSwap(p, nil) }
}

// Attr is one span attribute.
type Attr = attribute.KeyValue

// String, Int and Bool make attributes without importing OTel.
func String(k, v string) Attr    { return attribute.String(k, v) }
func Int(k string, v int) Attr   { return attribute.Int(k, v) }
func Bool(k string, v bool) Attr { return attribute.Bool(k, v) }

// Sandbox is the attributes every span about sb carries.
func Sandbox(sb *sandbox.Sandbox) []Attr {
	if sb == nil || !Enabled() {
		return nil
	}
	return []Attr{
		attribute.String("sandbox.id", sb.ID),
		attribute.String("sandbox.template", sb.Template),
		attribute.String("sandbox.runtime", sb.Runtime),
	}
}

// Span is a phase started by Phase. The zero Span (tracing off) does nothing.
type Span struct{ s oteltrace.Span }

// Phase starts the span name as a child of ctx's span (a root span when ctx
// has none) and returns the context that carries it. With tracing off it
// returns ctx itself and a zero Span.
func Phase(ctx context.Context, name string, attrs ...Attr) (context.Context, Span) {
	p := active.Load()
	if p == nil {
		return ctx, Span{}
	}
	ctx, s := p.tracer.Start(ctx, name, oteltrace.WithAttributes(attrs...))
	return ctx, Span{s}
}

// Set adds attributes to the span.
func (s Span) Set(attrs ...Attr) {
	if s.s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// End ends the span; a non-nil err marks it failed with the error's kind
// and short message.
func (s Span) End(err error) {
	if s.s == nil {
		return
	}
	if err != nil {
		markError(s.s, err)
	}
	s.s.End()
}

// EndErr is End for a defer over a named error result: defer sp.EndErr(&err).
func (s Span) EndErr(err *error) {
	if err == nil {
		s.End(nil)
		return
	}
	s.End(*err)
}

// Do runs fn inside the phase name and ends it with fn's error.
func Do(ctx context.Context, name string, fn func(context.Context) error) error {
	ctx, s := Phase(ctx, name)
	err := fn(ctx)
	s.End(err)
	return err
}

// Set adds attributes to the span ctx carries (none: nothing happens).
func Set(ctx context.Context, attrs ...Attr) {
	if active.Load() == nil {
		return
	}
	oteltrace.SpanFromContext(ctx).SetAttributes(attrs...)
}

// Event records a point in time on the span ctx carries, e.g. a fallback.
func Event(ctx context.Context, name string, attrs ...Attr) {
	if active.Load() == nil {
		return
	}
	oteltrace.SpanFromContext(ctx).AddEvent(name, oteltrace.WithAttributes(attrs...), oteltrace.WithTimestamp(time.Now()))
}

// IDs returns the trace and span id of the span ctx carries, or "" when it
// carries none.
func IDs(ctx context.Context) (traceID, spanID string) {
	sc := oteltrace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

// maxStatus bounds the status message of a failed span.
const maxStatus = 256

func markError(s oteltrace.Span, err error) {
	msg := errs.Short(err)
	if len(msg) > maxStatus {
		msg = msg[:maxStatus]
	}
	s.SetAttributes(attribute.String("error.type", errorType(err)))
	s.SetStatus(codes.Error, msg)
}

// errorType is the error's berth kind in lower case ("not_found", ...);
// a context deadline is reported as such.
func errorType(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "deadline_exceeded"
	}
	return errs.KindOf(err).String()
}
