package e2b

import (
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/audit"
)

// audited runs an authenticated control-plane request and appends one
// `api` entry to the audit chain (docs/AUDIT.md), as /v1's middleware
// does: actor, method, route pattern (marked e2b), outcome status,
// sandbox. A create's new sandbox is read from the answer's sandboxID.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, owner string, h http.HandlerFunc) {
	sw := &statusWriter{ResponseWriter: w, sniff: r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes")}
	h(sw, r)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	id := r.PathValue("id")
	if id == "" && status < 300 {
		if m := sandboxIDRe.FindSubmatch(sw.head); m != nil {
			id = string(m[1])
		}
	}
	s.d.Audit().Record(audit.Entry{Time: time.Now(), Actor: owner, Action: "api", SandboxID: id, Owner: owner,
		Data: map[string]string{"surface": "e2b", "method": r.Method, "route": r.Pattern, "status": strconv.Itoa(status)}})
}

var sandboxIDRe = regexp.MustCompile(`"sandboxID":\s*"([a-z0-9]{1,64})"`)

// statusWriter remembers the status written (and a create's first bytes);
// Unwrap keeps http.ResponseController working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
	sniff  bool
	head   []byte
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.sniff && len(w.head) < 512 {
		w.head = append(w.head, b[:min(len(b), 512-len(w.head))]...)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
