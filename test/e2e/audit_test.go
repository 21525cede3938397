package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// auditEntry is the wire form of one audit entry (api/wire.AuditEntry).
type auditEntry struct {
	Seq     int64             `json:"seq"`
	Actor   string            `json:"actor"`
	Action  string            `json:"action"`
	Sandbox string            `json:"sandbox"`
	Owner   string            `json:"owner"`
	Data    map[string]string `json:"data"`
	Hash    string            `json:"hash"`
}

// auditLog exports the chain as key sees it (every page, JSON lines).
func (s *server) auditLog(key string, args ...string) []auditEntry {
	s.t.Helper()
	out, _, code := s.runSplit(key, nil, append([]string{"audit", "export"}, args...)...)
	if code != 0 {
		s.t.Fatalf("berth audit export: exit %d: %s", code, out)
	}
	var all []auditEntry
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e auditEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			s.t.Fatalf("audit export line %q: %v", line, err)
		}
		all = append(all, e)
	}
	return all
}

// find returns the index of the first entry after from that matches.
func findAudit(log []auditEntry, from int, match func(auditEntry) bool) int {
	for i := max(from, 0); i < len(log); i++ {
		if match(log[i]) {
			return i
		}
	}
	return -1
}

func apiCall(id, route string) func(auditEntry) bool {
	return func(e auditEntry) bool { return e.Action == "api" && e.Sandbox == id && e.Data["route"] == route }
}

// TestAuditTrail: on both runtimes, a tenant's create, exec, pause,
// resume and fork, and the admin's pause, appear in the chain in order with
// their actors; another tenant sees none of them; the entries outlive the
// sandboxes; verify passes.
func TestAuditTrail(t *testing.T) {
	s := startServer(t)
	alice := strings.TrimSpace(s.must("key", "create", "--owner", "alice"))
	mallory := strings.TrimSpace(s.must("key", "create", "--owner", "mallory"))
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			out, code := s.runAs(alice, nil, "create", "--template", "tiny", "--runtime", rt)
			if code != 0 {
				t.Fatalf("create: %s", out)
			}
			id := strings.TrimSpace(out)
			c1 := s.checkpoint(alice, id)
			if out, code := s.runAs(alice, nil, "exec", "--user", "root", id, "--", "echo", "audited-"+rt); code != 0 {
				t.Fatalf("exec: %s", out)
			}
			s.must("pause", id, "--mode", "freeze") // the admin acts on alice's sandbox
			if out, code := s.runAs(alice, nil, "resume", id); code != 0 {
				t.Fatalf("resume: %s", out)
			}
			out, code = s.runAs(alice, nil, "fork", id, "-n", "1", "--json")
			if code != 0 {
				t.Fatalf("fork: %s", out)
			}
			var fr forkResult
			if err := json.Unmarshal([]byte(out), &fr); err != nil || len(fr.Sandboxes) != 1 {
				t.Fatalf("fork output %q: %v", out, err)
			}
			child := fr.Sandboxes[0].ID
			// A rewind to before the exec appends; it rolls nothing back.
			if out, code := s.runAs(alice, nil, "rewind", id, "--to", c1.ID); code != 0 {
				t.Fatalf("rewind: %s", out)
			}
			if out, code := s.runAs(mallory, nil, "exec", id, "--", "true"); code == 0 {
				t.Fatalf("mallory's exec on alice's sandbox succeeded: %s", out)
			}

			var log []auditEntry
			testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
				log = s.auditLog(alice, "--sandbox", id)
				if findAudit(log, 0, apiCall(id, "POST /v1/sandboxes/{id}/rewind")) < 0 {
					return fmt.Errorf("rewind not yet in alice's audit log: %+v", log)
				}
				return nil
			})
			steps := []struct {
				what  string
				match func(auditEntry) bool
			}{
				{"create by alice", func(e auditEntry) bool {
					return e.Action == "api" && e.Data["route"] == "POST /v1/sandboxes" && e.Actor == "alice" && e.Data["status"] == "201"
				}},
				{"exec command line", func(e auditEntry) bool {
					return e.Action == "exec" && e.Data["argv"] == `["echo","audited-`+rt+`"]` && e.Data["user"] == "root"
				}},
				{"exec call by alice", func(e auditEntry) bool {
					return apiCall(id, "POST /v1/sandboxes/{id}/exec")(e) && e.Actor == "alice" && e.Data["status"] == "200"
				}},
				{"paused", func(e auditEntry) bool { return e.Action == "sandbox.paused" && e.Data["mode"] == "freeze" }},
				{"pause call by the admin", func(e auditEntry) bool {
					return apiCall(id, "POST /v1/sandboxes/{id}/pause")(e) && e.Data["admin"] == "true" && e.Owner == "alice"
				}},
				{"resumed", func(e auditEntry) bool { return e.Action == "sandbox.resumed" && e.Actor == "alice" }},
				{"fork call by alice", apiCall(id, "POST /v1/sandboxes/{id}/fork")},
				{"restored to the checkpoint", func(e auditEntry) bool {
					return e.Action == "sandbox.restored" && e.Data["checkpoint"] == c1.ID && e.Data["from"] == id && e.Data["point_at"] != ""
				}},
				{"rewind call by alice", apiCall(id, "POST /v1/sandboxes/{id}/rewind")},
			}
			t.Logf("alice's audit log of %s:\n%s", id, dumpAudit(log))
			at := -1
			for _, st := range steps {
				i := findAudit(log, at+1, st.match)
				if i < 0 {
					t.Fatalf("%s: not found after entry %d in alice's log:\n%s", st.what, at, dumpAudit(log))
				}
				at = i
			}
			for _, e := range log {
				if e.Owner != "alice" {
					t.Errorf("alice's log holds another owner's entry: %+v", e)
				}
			}
			// The fork is the child's entry, naming its parent.
			childLog := s.auditLog(alice, "--sandbox", child)
			if findAudit(childLog, 0, func(e auditEntry) bool {
				return e.Action == "sandbox.forked" && e.Data["from"] == id && e.Data["parent"] == id && e.Actor == "alice"
			}) < 0 {
				t.Errorf("no sandbox.forked entry naming the parent in the child's log:\n%s", dumpAudit(childLog))
			}
			// Mallory sees her own refused attempt and nothing of alice's.
			mlog := s.auditLog(mallory)
			for _, e := range mlog {
				if e.Owner != "mallory" || e.Actor != "mallory" {
					t.Errorf("mallory sees an entry not hers: %+v", e)
				}
			}
			if findAudit(mlog, 0, func(e auditEntry) bool {
				return apiCall(id, "POST /v1/sandboxes/{id}/exec")(e) && e.Data["status"] == "404"
			}) < 0 {
				t.Errorf("mallory's refused exec is not in her log:\n%s", dumpAudit(mlog))
			}
			if out, code := s.runAs(mallory, nil, "audit", "verify"); code != 5 {
				t.Errorf("audit verify with a tenant key: exit %d (want 5, admin only): %s", code, out)
			}

			// Entries are never deleted with their sandbox.
			s.must("rm", "-f", child, id)
			testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
				after := s.auditLog(s.key, "--sandbox", id)
				if findAudit(after, 0, apiCall(id, "DELETE /v1/sandboxes/{id}")) < 0 {
					return fmt.Errorf("delete not yet audited")
				}
				if len(after) < len(log) {
					return fmt.Errorf("%d entries after the delete, %d before", len(after), len(log))
				}
				return nil
			})
			if out := s.must("audit", "verify"); !strings.HasPrefix(out, "ok:") {
				t.Fatalf("audit verify: %s", out)
			}
		})
	}
}

func dumpAudit(log []auditEntry) string {
	var b strings.Builder
	for _, e := range log {
		fmt.Fprintf(&b, "  %d %s %s %s owner=%s %v\n", e.Seq, e.Actor, e.Action, e.Sandbox, e.Owner, e.Data)
	}
	return b.String()
}

// sqlite runs SQL on a stopped server's database as someone with the
// sqlite3 tool would: the append-only triggers dropped first.
func (s *server) sqlite(stmts ...string) {
	s.t.Helper()
	testutil.RequireTool(s.t, "sqlite3")
	sql := "DROP TRIGGER IF EXISTS audit_append_only_update; DROP TRIGGER IF EXISTS audit_append_only_delete; " + strings.Join(stmts, "; ") + ";"
	out, err := exec.Command("sqlite3", filepath.Join(s.dataDir, "berth.db"), sql).CombinedOutput()
	if err != nil {
		s.t.Fatalf("sqlite3 %s: %v %s", sql, err, out)
	}
}

// TestAuditTamper: one row edited through sqlite3 on the stopped server's
// database makes `berth audit verify` exit non-zero naming that seq; a
// truncated tail is found at the next start and stays reported.
func TestAuditTamper(t *testing.T) {
	s := startServer(t)
	id := s.create()
	for i := range 3 {
		s.must("exec", id, "--", "echo", fmt.Sprint(i))
	}
	if out := s.must("audit", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("audit verify before tampering: %s", out)
	}
	log := s.auditLog(s.key)
	victim := log[findAudit(log, 0, func(e auditEntry) bool { return e.Action == "exec" })]
	s.stop()
	s.sqlite(fmt.Sprintf(`UPDATE audit SET data = '{"argv":"[\"innocent\"]","user":"","cwd":""}' WHERE seq = %d`, victim.Seq))
	s.start()
	out, code := s.run("audit", "verify")
	if code == 0 || !strings.Contains(out, fmt.Sprintf("seq %d:", victim.Seq)) || !strings.Contains(out, "changed") {
		t.Fatalf("audit verify after editing seq %d: exit %d:\n%s", victim.Seq, code, out)
	}

	// Cut the tail: the restart finds the store's end behind its heads
	// and records it, so new entries cannot hide the cut.
	last := s.auditLog(s.key)
	end := last[len(last)-1].Seq
	s.stop()
	s.sqlite(fmt.Sprintf(`DELETE FROM audit WHERE seq > %d`, end-2))
	s.start()
	s.must("exec", id, "--", "true")
	out, code = s.run("audit", "verify")
	if code == 0 || !strings.Contains(out, "recorded") || !strings.Contains(out, fmt.Sprintf("entries %d-", end-1)) {
		t.Fatalf("audit verify after cutting the tail after seq %d: exit %d:\n%s", end-2, code, out)
	}
}

// TestAuditKill9: the daemon killed with SIGKILL while entries are being
// written leaves no half entry and a continuous chain; after the restart
// verify passes and the chain continues.
func TestAuditKill9(t *testing.T) {
	s := startServer(t)
	id := s.create()
	for round := range 3 {
		var stop atomic.Bool
		var wg sync.WaitGroup
		var calls atomic.Int64
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					s.run("exec", id, "--", "true")
					s.run("inspect", id)
					calls.Add(1)
				}
			}()
		}
		testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
			if calls.Load() < 20 {
				return fmt.Errorf("%d calls so far", calls.Load())
			}
			return nil
		})
		s.kill9()
		stop.Store(true)
		wg.Wait()
		s.start()
		out, code := s.run("audit", "verify", "--json")
		var rep struct {
			OK      bool  `json:"ok"`
			Entries int64 `json:"entries"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Entries < 20 {
			t.Fatalf("round %d: audit verify after kill -9 (after %d calls): exit %d: %s", round, calls.Load(), code, out)
		}
		t.Logf("round %d: kill -9 after %d calls: %d entries intact", round, calls.Load(), rep.Entries)
	}
	s.must("exec", id, "--", "true")
	if out := s.must("audit", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("audit verify after the chain continued: %s", out)
	}
}

// TestAuditInSandboxPrincipal: a request through the in-sandbox API
// (docs/STATE.md) is audited as that sandbox, on both runtimes. It needs
// the `self` branch (the agent's api socket and the server's selfRoutes).
func TestAuditInSandboxPrincipal(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			// Root inside the sandbox calls its own API (routes of the
			// allowlist: its sandbox, its task ledger, its note), then one it
			// must not reach.
			ok := false
			for _, path := range []string{"/v1/sandboxes/self", "/v1/sandboxes/self/tasks", "/v1/sandboxes/self/note"} {
				if _, code := s.run("exec", "--user", "root", id, "--", "/.berth/berth-agent", "api", "GET", path); code == 0 {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("no in-sandbox api call succeeded (the self branch is not merged?)")
			}
			s.run("exec", "--user", "root", id, "--", "/.berth/berth-agent", "api", "POST", "/v1/audit/verify")
			var log []auditEntry
			testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
				log = s.auditLog(s.key, "--sandbox", id)
				if findAudit(log, 0, func(e auditEntry) bool { return e.Action == "api" && e.Actor == "sandbox:"+id }) < 0 {
					return fmt.Errorf("no entry with actor sandbox:%s:\n%s", id, dumpAudit(log))
				}
				return nil
			})
			for _, e := range log {
				if e.Actor == "sandbox:"+id && (e.Owner == "" || e.Sandbox != id) {
					t.Errorf("in-sandbox entry not bound to its sandbox and owner: %+v", e)
				}
				if e.Actor == "sandbox:"+id && e.Data["route"] == "POST /v1/audit/verify" && e.Data["status"] == "200" {
					t.Errorf("the sandbox verified the audit chain: %+v", e)
				}
			}
		})
	}
}

// TestAuditE2BControlPlane: the E2B surface's calls are audited like /v1's.
func TestAuditE2BControlPlane(t *testing.T) {
	s := startServer(t)
	alice := strings.TrimSpace(s.must("key", "create", "--owner", "alice"))
	req, _ := http.NewRequest("POST", s.url+"/sandboxes", strings.NewReader(`{"templateID":"tiny","timeout":300}`))
	req.Header.Set("X-API-KEY", alice)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated || created.SandboxID == "" {
		t.Fatalf("E2B create: %d %v %+v", resp.StatusCode, err, created)
	}
	req, _ = http.NewRequest("DELETE", s.url+"/sandboxes/"+created.SandboxID, nil)
	req.Header.Set("X-API-KEY", alice)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("E2B kill: %v %v", resp, err)
	}
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		log := s.auditLog(alice, "--sandbox", created.SandboxID)
		for _, want := range []string{"POST /sandboxes", "DELETE /sandboxes/{id}"} {
			if findAudit(log, 0, func(e auditEntry) bool {
				return e.Action == "api" && e.Actor == "alice" && e.Data["surface"] == "e2b" && e.Data["route"] == want
			}) < 0 {
				return fmt.Errorf("no e2b %s entry:\n%s", want, dumpAudit(log))
			}
		}
		return nil
	})
}

// TestAuditEgressVerdict: root in a sandbox whose policy allows one name
// connecting elsewhere is the proxy's egress.deny, audited as that
// sandbox, on both runtimes (a deny-all sandbox's packets never reach the
// proxy: nftables drops them).
func TestAuditEgressVerdict(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt, "--allow", "allowed.test")
			s.run("exec", "--user", "root", id, "--", "sh", "-c", "echo probe | nc -w 3 203.0.113.9 80; true")
			testutil.Eventually(t, testutil.Within(15*time.Second), func() error {
				log := s.auditLog(s.key, "--sandbox", id)
				if findAudit(log, 0, func(e auditEntry) bool {
					return e.Action == "egress.deny" && e.Actor == "sandbox:"+id && e.Data["proto"] == "tcp" && e.Data["dst"] == "203.0.113.9:80"
				}) < 0 {
					out, _ := s.run("net", "log", id, "--json")
					return fmt.Errorf("no egress.deny entry:\n%s\negress log: %s", dumpAudit(log), out)
				}
				return nil
			})
		})
	}
}
