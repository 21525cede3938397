package httpx

import (
	"io"
	"net/http"
)

// Recorder wraps a ResponseWriter to remember the status a handler wrote
// and, when Sniff > 0, the first Sniff bytes of the body (the audit
// middlewares of /v1 and of E2B's control plane read a create's new id
// from them). Unwrap keeps http.ResponseController (flush, deadlines)
// working through it; ReadFrom keeps the underlying io.ReaderFrom
// (sendfile for file downloads) when nothing is sniffed.
type Recorder struct {
	http.ResponseWriter
	Status int // 0 until the handler writes
	Sniff  int
	Head   []byte
}

// WriteHeader records the first status.
func (w *Recorder) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200 and the body's first bytes.
func (w *Recorder) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	if len(w.Head) < w.Sniff {
		w.Head = append(w.Head, b[:min(len(b), w.Sniff-len(w.Head))]...)
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom copies r to the response, through Write when sniffing.
func (w *Recorder) ReadFrom(r io.Reader) (int64, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	if len(w.Head) < w.Sniff {
		return io.Copy(struct{ io.Writer }{w}, r)
	}
	return io.Copy(w.ResponseWriter, r)
}

// Unwrap is the wrapped writer (for http.ResponseController).
func (w *Recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
