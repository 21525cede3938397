package e2b

import (
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/audit"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// audited runs an authenticated control-plane request and appends one
// `api` entry to the audit chain (docs/AUDIT.md), as /v1's middleware
// does: actor, method, route pattern (marked e2b), outcome status,
// sandbox. A create's new sandbox is read from the answer's sandboxID.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, owner string, h http.HandlerFunc) {
	sw := &httpx.Recorder{ResponseWriter: w}
	if r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes") {
		sw.Sniff = 512 // the new sandbox's id
	}
	h(sw, r)
	status := sw.Status
	if status == 0 {
		status = http.StatusOK
	}
	id := r.PathValue("id")
	if id == "" && status < 300 {
		if m := sandboxIDRe.FindSubmatch(sw.Head); m != nil {
			id = string(m[1])
		}
	}
	s.d.Audit().Record(audit.Entry{Time: time.Now(), Actor: owner, Action: "api", SandboxID: id, Owner: owner,
		Data: map[string]string{"surface": "e2b", "method": r.Method, "route": r.Pattern, "status": strconv.Itoa(status)}})
}

var sandboxIDRe = lazyregexp.New(`"sandboxID":\s*"([a-z0-9]{1,64})"`)
