package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

type poolStatus struct {
	Template    string `json:"template"`
	Fingerprint string `json:"fingerprint"`
	Ready       int    `json:"ready"`
	Starting    int    `json:"starting"`
	Hits        int64  `json:"hits"`
	Misses      int64  `json:"misses"`
	ClaimP50    int64  `json:"claim_p50_us"`
	IdleMemory  uint64 `json:"idle_memory_bytes"`
	State       string `json:"state"`
	Error       string `json:"error"`
}

func (s *server) pool(name string) poolStatus {
	s.t.Helper()
	var list []poolStatus
	if err := json.Unmarshal([]byte(s.must("pool", "ls", "--json")), &list); err != nil {
		s.t.Fatal(err)
	}
	for _, p := range list {
		if p.Template == name {
			return p
		}
	}
	s.t.Fatalf("no pool %s in %v", name, list)
	return poolStatus{}
}

func (s *server) waitPool(name string, ready int, fp string) poolStatus {
	s.t.Helper()
	var p poolStatus
	testutil.Eventually(s.t, testutil.Within(90*time.Second).Every(100*time.Millisecond), func() error {
		if p = s.pool(name); p.Ready == ready && p.Starting == 0 && (fp == "" || p.Fingerprint == fp) {
			return nil
		}
		return fmt.Errorf("pool %s never reached %d ready (fingerprint %s): %+v", name, ready, fp, p)
	})
	return p
}

// createAndExec creates through REST and runs one command; it returns the
// sandbox and the time from the create request to the first output byte.
func (s *server) createAndExec(body map[string]any) (map[string]any, time.Duration) {
	s.t.Helper()
	start := time.Now()
	code, sb := s.api(s.key, "POST", "/v1/sandboxes", body)
	if code != 201 {
		s.t.Fatalf("create: %d %v", code, sb)
	}
	b, _ := json.Marshal(map[string]any{"cmd": []string{"echo", "ready"}})
	req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+sb["id"].(string)+"/exec", bytes.NewReader(b))
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Type string `json:"type"`
			Data []byte `json:"data"`
		}
		_ = json.Unmarshal(sc.Bytes(), &ev)
		if ev.Type == "stdout" {
			took := time.Since(start)
			if strings.TrimSpace(string(ev.Data)) != "ready" {
				s.t.Fatalf("exec output %q", ev.Data)
			}
			return sb, took
		}
	}
	s.t.Fatalf("exec produced no output (status %d)", resp.StatusCode)
	return nil, 0
}

func p50(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// TestWarmPool: hits are personalised and hidden members never show up;
// a request the pool cannot serve is a miss; re-importing the template
// drains and rebuilds the pool.
func TestWarmPool(t *testing.T) {
	s := startServer(t)
	s.must("pool", "set", "tiny", "--size", "3")
	first := s.waitPool("tiny", 3, "")
	if out := s.must("ls", "--json"); strings.Contains(out, "_pool") {
		t.Fatalf("pool members listed: %s", out)
	}

	var warm, cold []time.Duration
	var made []string
	for range 9 {
		sb, took := s.createAndExec(map[string]any{"template": "tiny", "labels": map[string]string{"who": "bob"},
			"env": map[string]string{"GREETING": "hi"}, "ttl": "5m"})
		made = append(made, sb["id"].(string))
		extra, _ := sb["extra"].(map[string]any)
		if extra["claimed_from_pool"] != "tiny" {
			t.Fatalf("create was not served by the pool: %v", sb)
		}
		if sb["owner"] != "admin" || sb["labels"].(map[string]any)["who"] != "bob" {
			t.Fatalf("claimed sandbox not personalised: %v", sb)
		}
		warm = append(warm, took)
		s.waitPool("tiny", 3, "")
	}
	id := made[0]
	if out := s.must("exec", id, "--", "sh", "-c", "echo $GREETING $BERTH_SANDBOX_ID"); out != "hi "+id {
		t.Fatalf("env after claim: %q", out)
	}
	if out := s.must("events", id); !strings.Contains(out, "claimed_from_pool") {
		t.Fatalf("no claim event:\n%s", out)
	}
	for range 3 {
		_, took := s.createAndExec(map[string]any{"template": "tiny", "memory_mib": 256}) // other shape: miss
		cold = append(cold, took)
	}
	p := s.pool("tiny")
	if p.Hits != 9 || p.Misses != 3 {
		t.Fatalf("hits %d misses %d, want 9 and 3", p.Hits, p.Misses)
	}
	t.Logf("warm create -> first exec output p50 %s (n=%d), cold p50 %s (n=%d); claim p50 %d us; idle memory %d KiB for %d members",
		p50(warm), len(warm), p50(cold), len(cold), p.ClaimP50, p.IdleMemory>>10, p.Ready)

	t.Run("invalidated by re-import", func(t *testing.T) {
		// A different tarball of the same files is a different layer, so a new fingerprint.
		dir := t.TempDir()
		tar2 := filepath.Join(dir, "tiny2.tar")
		if out, err := exec.Command("sh", "-c", "cp "+tinyTar(t)+" "+tar2+" && tar -rf "+tar2+" -C "+dir+" --transform s,^,etc/, "+
			"$(cd "+dir+" && echo x > marker && echo marker)").CombinedOutput(); err != nil {
			t.Fatalf("build second tarball: %v %s", err, out)
		}
		s.must("template", "import", "tiny", tar2)
		var tpl struct {
			Fingerprint string `json:"fingerprint"`
		}
		_, body := s.api(s.key, "GET", "/v1/templates/tiny", nil)
		tpl.Fingerprint, _ = body["fingerprint"].(string)
		if tpl.Fingerprint == first.Fingerprint {
			t.Fatalf("fingerprint did not change on re-import")
		}
		s.waitPool("tiny", 3, tpl.Fingerprint)
		sb, _ := s.createAndExec(map[string]any{"template": "tiny"})
		if sb["template_id"] != tpl.Fingerprint {
			t.Fatalf("claimed a member of the old template: %v", sb["template_id"])
		}
		if out := s.must("exec", sb["id"].(string), "--", "cat", "/etc/marker"); out != "x" {
			t.Fatalf("new member does not have the new template's files: %q", out)
		}
	})

	t.Run("template that cannot start backs off", func(t *testing.T) {
		s.must("pool", "set", "nosuch", "--size", "1")
		testutil.Eventually(t, testutil.Within(15*time.Second).Every(100*time.Millisecond), func() error {
			if p := s.pool("nosuch"); p.State != "waiting" || p.Error == "" {
				return fmt.Errorf("pool of a missing template never backed off with a reason: %+v", p)
			}
			return nil
		})
		s.must("pool", "rm", "nosuch")
		if code, body := s.api(s.key, "PUT", "/v1/pools/tiny", map[string]any{"size": 1000}); code != 400 || body["field"] != "size" {
			t.Fatalf("size 1000: %d %v", code, body)
		}
	})

	// Remove the pool and wait for its members to drain (the harness checks
	// that nothing is left on the host).
	s.must("pool", "rm", "tiny")
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(100*time.Millisecond), func() error {
		code, body := s.api(s.key, "GET", "/v1/sandboxes?owner=_pool", nil)
		if list, _ := body["sandboxes"].([]any); code != 200 || len(list) != 0 {
			return fmt.Errorf("pool members not drained: %v", body)
		}
		return nil
	})
}
