package api

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// A template build goes to the node with the most free memory (or the
// one ?node= names), signed as the admin, its tar streamed there and its
// progress back; the build history is every node's, newest first.
func TestTemplateBuildForwardAndHistory(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	builder := func(name string, started time.Time) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == "/v1/builds":
				_ = json.NewEncoder(w).Encode(wire.TemplateBuildList{Builds: []wire.TemplateBuild{
					{Seq: 1, Template: name, Kind: "build", StartedAt: started, Result: "ready"}}})
			case strings.HasSuffix(r.URL.Path, "/build"):
				b, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/x-ndjson")
				_, _ = io.WriteString(w, `{"step":"context","bytes":`+strconv.Itoa(len(b))+"}\n")
				w.(http.Flusher).Flush()
				_, _ = io.WriteString(w, `{"done":true,"node":"`+name+`"}`+"\n")
			default:
				http.NotFound(w, r)
			}
		}
	}
	small := c.node("a-small", 16384, builder("a-small", t0))
	big := c.node("b-big", 65536, builder("b-big", t0.Add(time.Hour)))

	tarBody := strings.Repeat("x", 300<<10)
	st, hdr, body := c.do("POST", c.url+"/v1/templates/py/build?dockerfile=Dockerfile", c.admin, tarBody)
	if st != 200 || hdr.Get(HeaderNode) != "b-big" || !strings.Contains(body, `"bytes":307200`) || !strings.Contains(body, `"node":"b-big"`) {
		t.Fatalf("build: %d node %q %s", st, hdr.Get(HeaderNode), body)
	}
	rb := big.requests()
	if len(rb) != 1 || !rb[0].signed || rb[0].principal != (peer.Principal{Owner: "admin", Admin: true}) || rb[0].header.Get("X-Api-Key") != "" {
		t.Fatalf("b-big saw %+v", rb)
	}
	if st, hdr, body := c.do("POST", c.url+"/v1/templates/py/build?node=a-small", c.admin, "tar"); st != 200 || hdr.Get(HeaderNode) != "a-small" {
		t.Fatalf("build on a named node: %d %q %s", st, hdr.Get(HeaderNode), body)
	}
	if len(small.requests()) != 1 {
		t.Fatalf("a-small saw %d requests, want 1", len(small.requests()))
	}
	if st, _, body := c.do("POST", c.url+"/v1/templates/py/build?node=nope", c.admin, "tar"); st != 400 || !strings.Contains(body, "node") {
		t.Fatalf("build on an unknown node: %d %s", st, body)
	}
	if st, _, _ := c.do("PUT", c.url+"/v1/templates/py/tar", c.key, "tar"); st != 403 {
		t.Fatalf("a tenant importing a template: %d", st)
	}
	c.renew("b-big", time.Now().Add(-time.Minute), 40)
	if st, _, body := c.do("POST", c.url+"/v1/templates/py/build?node=b-big", c.admin, "tar"); st != 503 || !strings.Contains(body, "b-big") {
		t.Fatalf("build on a node whose lease ran out: %d %s", st, body)
	}
	c.renew("b-big", time.Now(), 40)

	_, _, body = c.do("GET", c.url+"/v1/builds", c.admin, "")
	var bl wire.TemplateBuildList
	if err := json.Unmarshal([]byte(body), &bl); err != nil || len(bl.Builds) != 2 || bl.Builds[0].Template != "b-big" || bl.Builds[1].Template != "a-small" {
		t.Fatalf("merged builds: %s", body)
	}
	_, _, body = c.do("GET", c.url+"/v1/builds?limit=1", c.admin, "")
	if err := json.Unmarshal([]byte(body), &bl); err != nil || len(bl.Builds) != 1 || bl.Builds[0].Template != "b-big" {
		t.Fatalf("merged builds, limit 1: %s", body)
	}
}

// Snapshots are listed from every node; one snapshot's reads, deletes
// and promotions go to the node that holds it, found by asking them all.
func TestSnapshotsByID(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	holder := func(snap wire.Snapshot) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			p, _, _ := peer.Verify(r, c.token)
			mine := p.Admin || p.Owner == snap.Owner
			switch {
			case r.Method == "GET" && r.URL.Path == "/v1/snapshots":
				list := []wire.Snapshot{}
				if mine {
					list = append(list, snap)
				}
				_ = json.NewEncoder(w).Encode(list)
			case r.URL.Path == "/v1/snapshots/"+snap.ID && mine:
				switch r.Method {
				case "GET":
					_ = json.NewEncoder(w).Encode(snap)
				case "DELETE":
					w.WriteHeader(http.StatusNoContent)
				}
			case r.Method == "POST" && r.URL.Path == "/v1/snapshots/"+snap.ID+"/template":
				b, _ := io.ReadAll(r.Body)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(b)
			default:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, `{"code":404,"message":"snapshot not found","reason":"not_found"}`)
			}
		}
	}
	n1 := c.node("n1", 16384, holder(wire.Snapshot{ID: "snapa", Owner: "alice", CreatedAt: t0}))
	n2 := c.node("n2", 16384, holder(wire.Snapshot{ID: "snapb", Owner: "alice", CreatedAt: t0.Add(time.Hour)}))

	_, _, body := c.do("GET", c.url+"/v1/snapshots", c.key, "")
	var list []wire.Snapshot
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 2 || list[0].ID != "snapb" || list[1].ID != "snapa" {
		t.Fatalf("alice's snapshots: %s", body)
	}
	if _, _, body := c.do("GET", c.url+"/v1/snapshots", c.bob, ""); body != "[]\n" {
		t.Fatalf("bob's snapshots: %q", body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/snapshots/snapb", c.key, ""); st != 200 || !strings.Contains(body, `"id":"snapb"`) {
		t.Fatalf("get snapb: %d %s", st, body)
	}
	if st, _, _ := c.do("GET", c.url+"/v1/snapshots/snapb", c.bob, ""); st != 404 {
		t.Fatalf("bob gets alice's snapshot: %d", st)
	}
	if st, _, _ := c.do("GET", c.url+"/v1/snapshots/..%2f..%2fetc", c.key, ""); st != 404 {
		t.Fatalf("a snapshot id with slashes: %d", st)
	}
	st, hdr, body := c.do("POST", c.url+"/v1/snapshots/snapa/template", c.key, `{"name":"from-a"}`)
	if st != 201 || hdr.Get(HeaderNode) != "n1" || body != `{"name":"from-a"}` {
		t.Fatalf("promote snapa: %d %q %s", st, hdr.Get(HeaderNode), body)
	}
	if st, _, _ := c.do("DELETE", c.url+"/v1/snapshots/snapa", c.bob, ""); st != 404 {
		t.Fatalf("bob deletes alice's snapshot: %d", st)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/snapshots/snapa", c.key, ""); st != 204 {
		t.Fatalf("delete snapa: %d %s", st, body)
	}
	for _, rq := range n2.requests() {
		if rq.method != "GET" {
			t.Errorf("n2, which does not hold snapa, saw %s %s", rq.method, rq.path)
		}
	}
	var deletes int
	for _, rq := range n1.requests() {
		if rq.method == "DELETE" {
			deletes++
			if rq.principal != (peer.Principal{Owner: "alice"}) || !rq.signed {
				t.Errorf("delete reached n1 as %+v (signed %v)", rq.principal, rq.signed)
			}
		}
	}
	if deletes != 1 {
		t.Fatalf("n1 saw %d deletes, want 1", deletes)
	}
	// With a node silent, "not on the others" is not "not found".
	c.renew("n2", time.Now().Add(-time.Minute), 40)
	if st, _, body := c.do("GET", c.url+"/v1/snapshots/snapb", c.key, ""); st != 503 || !strings.Contains(body, "n2") {
		t.Fatalf("snapb with its node silent: %d %s", st, body)
	}
}

// E2B's snapshot list is the fleet's, ordered and paged by the replica;
// its template delete (a snapshot, on berth) reaches the node holding it.
func TestE2BSnapshots(t *testing.T) {
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e2bNode := func(snaps ...wire.Snapshot) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == "GET" && r.URL.Path == "/v1/snapshots":
				_ = json.NewEncoder(w).Encode(snaps)
			case r.Method == "DELETE" && r.URL.Path == "/templates/"+snaps[0].ID:
				w.WriteHeader(http.StatusNoContent)
			case r.Method == "DELETE" && r.URL.Path == "/templates/default":
				w.WriteHeader(http.StatusNotImplemented)
				_, _ = io.WriteString(w, `{"code":501,"message":"DELETE /templates/default is not implemented by berth"}`)
			default:
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, `{"code":404,"message":"snapshot not found"}`)
			}
		}
	}
	n1 := c.node("n1", 16384, e2bNode(wire.Snapshot{ID: "sa", Owner: "alice", Name: "one", SourceSandbox: "sbx1", CreatedAt: t0},
		wire.Snapshot{ID: "sc", Owner: "alice", SourceSandbox: "sbx2", CreatedAt: t0.Add(2 * time.Hour)}))
	n2 := c.node("n2", 16384, e2bNode(wire.Snapshot{ID: "sb", Owner: "alice", CreatedAt: t0.Add(time.Hour)}))

	st, hdr, body := c.do("GET", c.url+"/snapshots?limit=2", "", "", "X-API-KEY", c.key)
	if st != 200 || body != `[{"snapshotID":"sc","names":[]},{"snapshotID":"sb","names":[]}]`+"\n" || hdr.Get("X-Next-Token") != "sb" {
		t.Fatalf("first page: %d %q next %q", st, body, hdr.Get("X-Next-Token"))
	}
	st, hdr, body = c.do("GET", c.url+"/snapshots?limit=2&nextToken=sb", "", "", "X-API-KEY", c.key)
	if st != 200 || body != `[{"snapshotID":"sa","names":["one"]}]`+"\n" || hdr.Get("X-Next-Token") != "" {
		t.Fatalf("second page: %d %q next %q", st, body, hdr.Get("X-Next-Token"))
	}
	if _, _, body := c.do("GET", c.url+"/snapshots?sandboxID=sbx1", "", "", "X-API-KEY", c.key); !strings.Contains(body, `"sa"`) || strings.Contains(body, `"sc"`) {
		t.Fatalf("by sandbox: %s", body)
	}
	if st, _, body := c.do("GET", c.url+"/snapshots?nextToken=zz", "", "", "X-API-KEY", c.key); st != 400 || !strings.Contains(body, "nextToken") {
		t.Fatalf("bad token: %d %s", st, body)
	}
	if r1 := n1.requests(); r1[0].principal != (peer.Principal{Owner: "alice"}) {
		t.Fatalf("asked as %+v", r1[0].principal)
	}
	if st, _, body := c.do("DELETE", c.url+"/templates/sb", "", "", "X-API-KEY", c.key); st != 204 {
		t.Fatalf("delete sb: %d %s", st, body)
	}
	deleted := false
	for _, rq := range n2.requests() {
		deleted = deleted || (rq.method == "DELETE" && rq.path == "/templates/sb")
	}
	if !deleted {
		t.Fatal("n2 never saw the delete of sb")
	}
	if st, _, _ := c.do("DELETE", c.url+"/templates/nosuch", "", "", "X-API-KEY", c.key); st != 404 {
		t.Fatalf("delete of an unknown snapshot: %d", st)
	}
	if st, _, _ := c.do("DELETE", c.url+"/templates/default", "", "", "X-API-KEY", c.key); st != 501 {
		t.Fatalf("delete of a real template: %d", st)
	}
}

// A template is removed from every node, and its object only once every
// node has answered.
func TestTemplateDelete(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	for _, name := range []string{"py", "busy"} {
		if _, err := c.st.PutTemplate(ctx, store.Template{Name: name, Fingerprint: "fp-" + name, State: store.TemplateReady}); err != nil {
			t.Fatal(err)
		}
	}
	c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/templates/py":
			_ = json.NewEncoder(w).Encode(wire.TemplateDeleted{Removed: "py", LayersCollected: 2})
		case "/v1/templates/busy":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"code":409,"message":"template busy is used by 1 sandbox","reason":"failed_precondition"}`)
		default:
			http.NotFound(w, r)
		}
	})
	c.node("n2", 16384, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	if st, _, _ := c.do("DELETE", c.url+"/v1/templates/py", c.key, ""); st != 403 {
		t.Fatalf("a tenant removing a template: %d", st)
	}
	c.renew("n2", time.Now().Add(-time.Minute), 40)
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/py", c.admin, ""); st != 503 || !strings.Contains(body, "n2") {
		t.Fatalf("delete with n2 silent: %d %s", st, body)
	}
	if _, err := c.st.GetTemplate(ctx, "py"); err != nil {
		t.Fatalf("the object went with a node unasked: %v", err)
	}
	c.renew("n2", time.Now(), 40)
	st, _, body := c.do("DELETE", c.url+"/v1/templates/py", c.admin, "")
	if st != 200 || !strings.Contains(body, `"layers_collected": 2`) {
		t.Fatalf("delete py: %d %s", st, body)
	}
	if _, err := c.st.GetTemplate(ctx, "py"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("py's object after the delete: %v", err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/busy", c.admin, ""); st != 409 || !strings.Contains(body, "used by") {
		t.Fatalf("delete busy: %d %s", st, body)
	}
	if _, err := c.st.GetTemplate(ctx, "busy"); err != nil {
		t.Fatalf("busy's object after a refused delete: %v", err)
	}
	if st, _, _ := c.do("DELETE", c.url+"/v1/templates/nosuch", c.admin, ""); st != 404 {
		t.Fatalf("delete of an unknown template: %d", st)
	}
}
