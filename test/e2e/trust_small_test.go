package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
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
