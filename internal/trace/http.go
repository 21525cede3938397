package trace

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// Handler gives every request a server span: a child of the caller's trace
// when the request carries a valid traceparent, a new trace otherwise. The
// span is named after the method until Route names the matched pattern.
// With tracing off it is h itself.
func Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := active.Load()
		if p == nil {
			h.ServeHTTP(w, r)
			return
		}
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := p.tracer.Start(ctx, r.Method, oteltrace.WithSpanKind(oteltrace.SpanKindServer),
			oteltrace.WithAttributes(
				attribute.String("http.request.method", r.Method),
				attribute.String("url.path", r.URL.Path),
			))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// Route names the request's span after the route pattern it matched
// ("POST /v1/sandboxes/{id}/exec"), the low-cardinality name OTel asks for.
func Route(ctx context.Context, pattern string) {
	if active.Load() == nil {
		return
	}
	s := oteltrace.SpanFromContext(ctx)
	s.SetName(pattern)
	s.SetAttributes(attribute.String("http.route", pattern))
}

// statusWriter records the response status; Unwrap keeps
// http.ResponseController (flushes of exec streams, hijacks) working.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom keeps the underlying writer's sendfile path for file downloads.
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	w.wroteHeader = true
	return io.Copy(w.ResponseWriter, r)
}

func (w *statusWriter) Flush() {
	w.wroteHeader = true
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}
