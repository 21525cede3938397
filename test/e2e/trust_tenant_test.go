package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestForeignTenantCannotKeepSandboxAwake: bob hammers the client routes of
// alice's sandbox (exec, files) with his own key; every request is refused,
// and none counts as activity: the reaper parks alice's idle sandbox as if
// bob were not there.
func TestForeignTenantCannotKeepSandboxAwake(t *testing.T) {
	s := startReaperServer(t)
	keys := map[string]string{}
	for _, o := range []string{"alice", "bob"} {
		code, body := s.api(s.key, "POST", "/v1/keys", map[string]any{"owner": o})
		if code != http.StatusCreated {
			t.Fatalf("key %s: %d %v", o, code, body)
		}
		keys[o] = body["key"].(string)
	}
	code, body := s.api(keys["alice"], "POST", "/v1/sandboxes", map[string]any{"template": "tiny"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, body)
	}
	id := body["id"].(string)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var refusals, accepted int
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for _, p := range []string{"/v1/sandboxes/" + id + "/exec", "/v1/sandboxes/" + id + "/files?path=/etc/passwd"} {
				method := "GET"
				if strings.HasSuffix(p, "/exec") {
					method = "POST"
				}
				req, _ := http.NewRequestWithContext(ctx, method, s.url+p, strings.NewReader(`{"argv":["true"]}`))
				req.Header.Set("X-API-Key", keys["bob"])
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode/100 == 2 {
					accepted++
				} else {
					refusals++
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	rpWaitFor(t, 30*time.Second, "alice's idle sandbox to be paused despite bob's requests", func() bool {
		return s.rpInspect(id).State == "paused"
	})
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if refusals == 0 || accepted != 0 {
		t.Fatalf("bob's requests: %d refused, %d not refused; want only refusals", refusals, accepted)
	}
}

// TestReservedOwnersHaveNoKeys: names berth's own actors use cannot be
// issued as API keys; the error names the owner field.
func TestReservedOwnersHaveNoKeys(t *testing.T) {
	s := startServer(t)
	for _, o := range []string{"berth-build", "berth", "admin", "reaper", "berth-anything"} {
		if out, code := s.run("key", "create", "--owner", o); code == 0 || !strings.Contains(out, "owner") || !strings.Contains(out, "reserved") {
			t.Errorf("key create --owner %s: exit %d: %s", o, code, out)
		}
		if code, body := s.api(s.key, "POST", "/v1/keys", map[string]any{"owner": o}); code != http.StatusBadRequest || body["field"] != "owner" {
			t.Errorf("POST /v1/keys owner=%s: %d %v, want 400 naming owner", o, code, body)
		}
	}
	if out, code := s.run("key", "create", "--owner", "carol"); code != 0 {
		t.Errorf("key create --owner carol: exit %d: %s", code, out)
	}
}

// TestNetLogEscapesTerminalBytes: a sandbox asks DNS for a name carrying
// terminal escape sequences (names are logged lowercased, so lowercase
// ones); `berth net log` prints them escaped, and the
// JSON output keeps the exact name.
func TestNetLogEscapesTerminalBytes(t *testing.T) {
	s := startServer(t)
	id := s.create()
	const evil = "x\x1b]0;pwned\x07\x1b[0m.test"
	s.run("exec", id, "--", "sh", "-c", `nslookup "$(printf 'x\033]0;pwned\007\033[0m.test')" >/dev/null 2>&1; true`)
	var found bool
	deadline := time.Now().Add(10 * time.Second)
	for !found && time.Now().Before(deadline) {
		var entries []struct {
			Host string `json:"host"`
		}
		if err := json.Unmarshal([]byte(s.must("net", "log", id, "--json")), &entries); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Host, "x\x1b]0;pwned") {
				found = true
				if !strings.Contains(e.Host, "\x1b[0m") {
					t.Errorf("JSON host %q is not the exact name asked for (%q)", e.Host, evil)
				}
			}
		}
		if !found {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if !found {
		t.Fatalf("the DNS query for the escape-laden name is not in the log:\n%s", s.must("net", "log", id, "--json"))
	}
	out := s.must("net", "log", id)
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("net log printed raw terminal control bytes:\n%q", out)
	}
	if !strings.Contains(out, `x\x1b]0;pwned\x07\x1b[0m`) {
		t.Errorf("net log does not show the name escaped:\n%s", out)
	}
}

// TestSecretsAtRest: after a server start the database, its WAL files and
// every key file are 0600 and the data dir 0700; an E2B sandbox's envd
// access token is stored as its SHA-256, never as the token, and connect
// hands the SDK the same working token again.
func TestSecretsAtRest(t *testing.T) {
	s := startServer(t)
	c, body := s.e2b("POST", "/sandboxes", map[string]any{"templateID": "tiny"})
	if c != http.StatusCreated {
		t.Fatalf("e2b create: %d %v", c, body)
	}
	id, _ := body["sandboxID"].(string)
	token, _ := body["envdAccessToken"].(string)
	if id == "" || token == "" {
		t.Fatalf("e2b create answered %v", body)
	}
	for _, f := range []string{"berth.db", "berth.db-wal", "berth.db-shm", "admin.key", "token.key", "egress/ca-key.pem", "egress/secrets.key"} {
		fi, err := os.Stat(filepath.Join(s.dataDir, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v, want 0600", f, fi.Mode().Perm())
		}
	}
	if why := notPrivateDir(s.dataDir); why != "" {
		t.Errorf("data dir: %s", why)
	}

	db, err := sql.Open("sqlite", filepath.Join(s.dataDir, "berth.db")+"?_pragma=query_only(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var stored string
	if err := db.QueryRow(`SELECT access_token FROM sandboxes WHERE id = ?`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	if stored == token || stored != hex.EncodeToString(sum[:]) {
		t.Fatalf("stored access token %q; want the SHA-256 of the token, not the token", stored)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sandboxes WHERE access_token = ?`, token).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows hold the plain token (%v)", n, err)
	}

	// Connect (a second SDK process) gets the same token, and it works.
	c, body = s.e2b("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300})
	if c/100 != 2 || body["envdAccessToken"] != token {
		t.Fatalf("connect: %d %v; want the token create returned", c, body)
	}
	if c := s.envdRead(id, token); c != http.StatusOK {
		t.Errorf("envd with the token: %d", c)
	}
	if c := s.envdRead(id, strings.Repeat("0", len(token))); c != http.StatusUnauthorized {
		t.Errorf("envd with a wrong token: %d, want 401", c)
	}
	if c := s.envdRead(id, stored); c != http.StatusUnauthorized {
		t.Errorf("envd with the stored hash as token: %d, want 401", c)
	}
	s.must("rm", "-f", id)
}

// e2b calls the E2B control plane with the admin key.
func (s *server) e2b(method, path string, body any) (int, map[string]any) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, s.url+path, bytes.NewReader(b))
	req.Header.Set("X-API-KEY", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// envdRead reads a file through envd with token; the status says whether
// the token was accepted (200) or not (401).
func (s *server) envdRead(id, token string) int {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/files?path=/etc/passwd", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestQuotaNoBypass: an owner at its quota cannot exceed it by stopping a
// sandbox, creating another and starting the first again, by forking (the
// children run like creates; a memory fork's too), or by the snapshots
// forks take. Every refusal is a 429 naming the limit.
func TestQuotaNoBypass(t *testing.T) {
	s := startServer(t)
	code, body := s.api(s.key, "POST", "/v1/keys", map[string]any{"owner": "alice"})
	if code != http.StatusCreated {
		t.Fatalf("key: %d %v", code, body)
	}
	alice := body["key"].(string)
	refused := func(what string, code int, body map[string]any, field string) {
		t.Helper()
		if code != http.StatusTooManyRequests || body["field"] != field || !strings.Contains(fmt.Sprint(body["message"]), "limit "+field) {
			t.Errorf("%s: %d %v; want 429 naming the %s limit", what, code, body, field)
		}
	}
	live := func() int {
		t.Helper()
		out, code := s.runAs(alice, nil, "ls", "--json")
		var list []struct{ State string }
		if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
			t.Fatalf("ls: %v %s", err, out)
		}
		n := 0
		for _, sb := range list {
			if sb.State != "stopped" && sb.State != "failed" {
				n++
			}
		}
		return n
	}
	create := func(rt string) string {
		t.Helper()
		code, body := s.api(alice, "POST", "/v1/sandboxes", map[string]any{"template": "tiny", "runtime": rt, "idle_policy": "never"})
		if code != http.StatusCreated {
			t.Fatalf("create: %d %v", code, body)
		}
		return body["id"].(string)
	}

	s.must("quota", "set", "alice", "--sandboxes", "1")
	a := create("runc")
	if c, b := s.api(alice, "POST", "/v1/sandboxes/"+a+"/stop", nil); c != http.StatusOK {
		t.Fatalf("stop: %d %v", c, b)
	}
	b := create("runc") // a stopped sandbox holds no slot
	c, body := s.api(alice, "POST", "/v1/sandboxes/"+a+"/start", nil)
	refused("start of a stopped sandbox at the quota", c, body, "sandboxes")
	if out, code := s.runAs(alice, nil, "start", a); code == 0 || !strings.Contains(out, "limit sandboxes") {
		t.Errorf("berth start at the quota: exit %d: %s", code, out)
	}
	c, body = s.api(alice, "POST", "/v1/sandboxes/"+b+"/fork", map[string]any{"count": 1})
	refused("fork at the quota", c, body, "sandboxes")
	if c, list := s.apiList(alice, "GET", "/v1/snapshots"); c != http.StatusOK || strings.Contains(list, `"id"`) {
		t.Errorf("a refused fork left a snapshot: %d %s", c, list)
	}
	if n := live(); n != 1 {
		t.Fatalf("alice runs %d sandboxes under a limit of 1", n)
	}

	// Fork snapshots count against the snapshot limit.
	s.must("quota", "set", "alice", "--sandboxes", "10", "--snapshots", "1")
	if c, body := s.api(alice, "POST", "/v1/sandboxes/"+b+"/snapshot", map[string]any{}); c/100 != 2 {
		t.Fatalf("snapshot: %d %v", c, body)
	}
	c, body = s.api(alice, "POST", "/v1/sandboxes/"+b+"/fork", map[string]any{"count": 1})
	refused("fork at the snapshot quota", c, body, "snapshots")
	if n := live(); n != 1 {
		t.Fatalf("alice runs %d sandboxes after a refused fork, want 1", n)
	}

	// Children of a fork are admitted one by one: with room for one more,
	// a fork of three makes one. On runsc (or runc with CRIU) they are
	// memory-fork children, restored rather than created.
	rt := "runc"
	if strings.Contains(s.must("info"), "runsc") {
		rt = "runsc"
		defer s.stopRunsc()
	}
	s.must("rm", "-f", b)
	p := create(rt)
	s.must("quota", "set", "alice", "--sandboxes", "2")
	c, body = s.api(alice, "POST", "/v1/sandboxes/"+p+"/fork", map[string]any{"count": 3})
	if c != http.StatusCreated {
		t.Fatalf("fork of 3 with room for 1: %d %v", c, body)
	}
	kids, _ := body["sandboxes"].([]any)
	t.Logf("%s fork_mode %v: %d children, reason %v", rt, body["fork_mode"], len(kids), body["reason"])
	if len(kids) != 1 || !strings.Contains(fmt.Sprint(body["reason"]), "limit sandboxes") {
		t.Errorf("fork of 3 with room for 1 made %d children (reason %v); want 1 and the limit named", len(kids), body["reason"])
	}
	if n := live(); n != 2 {
		t.Errorf("alice runs %d sandboxes under a limit of 2", n)
	}
}
