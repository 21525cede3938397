package node

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/berth-dev/berth/internal/cluster/peer"
)

// maxPrefetchBody bounds how much of a create's body is read to find its
// template; a larger body goes on untouched (the route judges it).
const maxPrefetchBody = 1 << 20

// Prefetch wraps the peer surface so a replica's forwarded create (REST
// POST /v1/sandboxes, E2B POST /sandboxes and /v2/sandboxes) finds its
// template here: when the body names a template of the cluster this node
// lacks, its layers are fetched first (ensureTemplate), then the request
// goes on with its body intact; a REST create granting secrets mirrors the
// cluster's secrets first (secrets.go). Only verified cluster requests are looked
// at; anything else, and any failure here, is left to the routes (a fetch
// that failed makes the create fail as "template not found", and the
// agent's own create path retries after its grace).
func (a *Agent) Prefetch(next http.Handler) http.Handler {
	token := a.cfg.Daemon.Config().ClusterToken
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		field := ""
		if r.Method == http.MethodPost {
			switch r.URL.Path {
			case "/v1/sandboxes":
				field = "template"
			case "/sandboxes", "/v2/sandboxes":
				field = "templateID"
			}
		}
		if field == "" || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		if _, ok, err := peer.Verify(r, token); !ok || err != nil {
			next.ServeHTTP(w, r)
			return
		}
		head, err := io.ReadAll(io.LimitReader(r.Body, maxPrefetchBody+1))
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
		if err != nil || len(head) > maxPrefetchBody {
			next.ServeHTTP(w, r)
			return
		}
		var body map[string]json.RawMessage
		var name string
		if json.Unmarshal(head, &body) == nil && json.Unmarshal(body[field], &name) == nil && name != "" {
			if err := a.ensureTemplate(r.Context(), name); err != nil {
				a.log.Warn("fetch the template of a forwarded create", "template", name, "err", err)
			}
		}
		// A create granting secrets finds them here even when they were
		// set a moment ago (before the watch's pass): mirror first.
		var secrets []string
		if json.Unmarshal(body["secrets"], &secrets) == nil && len(secrets) > 0 {
			if err := a.SyncSecrets(r.Context()); err != nil {
				a.log.Warn("mirror the secrets of a forwarded create", "err", err)
			}
		}
		next.ServeHTTP(w, r)
	})
}
