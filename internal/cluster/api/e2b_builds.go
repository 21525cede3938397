package api

import (
	"net/http"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/e2b"
	"github.com/berth-dev/berth/internal/httpx"
)

// E2B's template build API (POST /v3/templates, POST
// /v2/templates/{id}/builds/{build}, GET .../status, the file uploads) is
// not served by one berth host: internal/e2b answers 501 for every
// /templates, /v2/templates and /v3/templates route but DELETE
// /templates/{id} (a snapshot there). A replica answers it the same, with
// the same message, so a client sees one berth whatever it points at;
// berth's own build (`berth template build`, POST
// /v1/templates/{name}/build) goes to a node (templates.go). If a node
// ever serves E2B builds, they belong with that build: sent to
// builderNode, status polls routed by the build's node.
func (r *Replica) e2bBuildRoutes(mux *http.ServeMux) {
	for _, p := range []string{"/templates", "/templates/", "/v2/templates", "/v2/templates/", "/v3/templates", "/v3/templates/"} {
		mux.HandleFunc(p, r.e2bAuthed(func(w http.ResponseWriter, req *http.Request, _ auth.Principal) {
			httpx.WriteJSON(w, http.StatusNotImplemented, e2b.StatusBody(http.StatusNotImplemented, req.Method+" "+req.URL.Path+" is not implemented by berth"))
		}))
	}
}
