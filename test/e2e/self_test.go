package e2e

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/testutil"
)

// selfProbeBin builds testdata/selfprobe (static) once per test process.
func selfProbeBin(t *testing.T) string {
	return testutil.BuildProgram(t, "./test/e2e/testdata/selfprobe")
}

// selfCall runs `berth-agent api ARGS...` inside sandbox id as user ("" =
// the default user) and returns its stdout, stderr and exit code.
func (s *server) selfCall(id, user string, args ...string) (string, string, int) {
	s.t.Helper()
	cmd := []string{"exec"}
	if user != "" {
		cmd = append(cmd, "--user", user)
	}
	cmd = append(append(cmd, id, "--", "/.berth/berth-agent", "api"), args...)
	return s.runSplit(s.key, nil, cmd...)
}

// selfID reads the sandbox id the in-sandbox API answers for GET self.
func (s *server) selfID(t *testing.T, id, user string) string {
	t.Helper()
	out, errOut, code := s.selfCall(id, user, "GET", "/v1/sandboxes/self")
	if code != 0 {
		t.Fatalf("in %s as %q: GET self: exit %d: %s%s", id, user, code, out, errOut)
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("GET self answered %q: %v", out, err)
	}
	return v.ID
}

// TestSelfAPI attacks the in-sandbox API from inside real sandboxes, as
// root and as an unprivileged user, on runc and runsc: a sandbox reads its
// own info and nothing else, cannot use or derive another sandbox's channel
// key, cannot starve another sandbox or the REST API, and keeps its API
// across a memory pause (with the socket in use) and a fork (the child is
// itself).
func TestSelfAPI(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	defer s.stopRunsc()
	probe := selfProbeBin(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			a, b := s.create("--runtime", rt), s.create("--runtime", rt)
			defer s.run("rm", "-f", a)
			defer s.run("rm", "-f", b)

			t.Run("own info as root and as a user", func(t *testing.T) {
				for _, user := range []string{"root", ""} {
					if got := s.selfID(t, a, user); got != a {
						t.Fatalf("as %q: GET self is %q, want %q", user, got, a)
					}
				}
				if uid := s.must("exec", a, "--", "id", "-u"); uid == "0" {
					t.Fatal("the default user is root: the unprivileged case is not tested")
				}
				if out := s.must("exec", a, "--", "sh", "-c", "echo $BERTH_API_SOCKET"); out != "/run/berth-agent/api.sock" {
					t.Fatalf("BERTH_API_SOCKET=%q", out)
				}
				out, _, code := s.selfCall(a, "", "GET", "/v1/sandboxes/"+a)
				if code != 0 || !strings.Contains(out, `"`+a+`"`) {
					t.Fatalf("GET own id: exit %d %s", code, out)
				}
				if out, _, code := s.selfCall(a, "", "--help"); code != 0 || !strings.Contains(out, "usage: berth-agent api") {
					t.Fatalf("--help: exit %d %s", code, out)
				}
			})

			t.Run("another sandbox and other routes are 403", func(t *testing.T) {
				for _, c := range [][]string{
					{"GET", "/v1/sandboxes/" + b},
					{"GET", "/v1/sandboxes/" + b + "/events"},
					{"POST", "/v1/sandboxes/self/exec", `{"cmd":["true"]}`},
					{"POST", "/v1/sandboxes/" + b + "/exec", `{"cmd":["true"]}`},
					{"DELETE", "/v1/sandboxes/self"},
					{"POST", "/v1/sandboxes/self/stop"},
					{"GET", "/v1/sandboxes/self/files?path=/etc/passwd"},
					{"GET", "/v1/secrets"},
					{"PUT", "/v1/secrets/X", `{"value":"v"}`},
					{"POST", "/v1/keys", `{"owner":"mallory"}`},
					{"GET", "/v1/sandboxes"},
					{"GET", "/v1/sandboxes/self/events"},
					{"GET", "/v1/usage"},
					{"GET", "/metrics"},
				} {
					for _, user := range []string{"root", ""} {
						out, errOut, code := s.selfCall(a, user, c...)
						if code != 1 || !strings.Contains(errOut, "403") {
							t.Errorf("as %q: %v: exit %d, stdout %q stderr %q; want 403", user, c, code, out, errOut)
						}
					}
				}
				for _, c := range [][]string{{"GET", "/v1/sandboxes/self/../" + b}, {"GET", "/v1/sandboxes/%2e%2e/" + b}} {
					if _, errOut, code := s.selfCall(a, "root", c...); code != 1 {
						t.Errorf("%v: exit %d, stderr %q; want refused", c, code, errOut)
					}
				}
				// Still there, both of them.
				for _, id := range []string{a, b} {
					if code, _ := s.api(s.key, "GET", "/v1/sandboxes/"+id, nil); code != 200 {
						t.Fatalf("sandbox %s: GET %d after the attempts", id, code)
					}
				}
			})

			t.Run("socket deleted or replaced by root", func(t *testing.T) {
				c := newCanary(t)
				s.asRoot(a, "rm -f /run/berth-agent/api.sock")
				waitSelf(t, s, a)
				s.asRoot(a, "rm -rf /run/berth-agent && ln -s /etc /run/berth-agent")
				waitSelf(t, s, a)
				if out, _ := s.asRoot(a, "test -L /run/berth-agent && echo link; ls -l /etc/api.sock 2>&1"); strings.Contains(out, "link") || !strings.Contains(out, "No such file") {
					t.Fatalf("the agent followed a planted link: %s", out)
				}
				s.asRoot(a, "rm -rf /run/berth-agent && mkdir -m 777 /run/berth-agent && touch /run/berth-agent/api.sock")
				waitSelf(t, s, a)
				if out, _ := s.asRoot(a, "stat -c '%a %u' /run/berth-agent"); strings.TrimSpace(out) != "755 0" {
					t.Fatalf("api dir after a takeover attempt: %q", out)
				}
				c.check(t, "after the socket attacks")
			})

			t.Run("channel keys are per sandbox", func(t *testing.T) {
				s.must("cp", probe, a+":/tmp/selfprobe")
				s.asRoot(a, "chmod 755 /tmp/selfprobe")
				// Where root can read PID 1's environment it holds its own key;
				// where it cannot, hand the key in as if it had got it anyway.
				out, _ := s.asRoot(a, "/tmp/selfprobe caller "+a)
				if strings.HasPrefix(out, "nokey") {
					t.Logf("%s: a sandbox root cannot read PID 1's key here; the test hands it in", rt)
				}
				master, err := os.ReadFile(filepath.Join(s.dataDir, "channel.key"))
				if err != nil {
					t.Fatal(err)
				}
				keyA := hex.EncodeToString(agentapi.DeriveKey(master, a))
				probeAs := func(args string) string {
					out, _ := s.asRoot(a, "SELFPROBE_KEY="+keyA+" /tmp/selfprobe "+args)
					return strings.TrimSpace(out)
				}
				// Its own key makes a direct caller itself, nothing more.
				if out := probeAs("caller " + a); !strings.HasPrefix(out, "answer 200 ") || !strings.Contains(out, a) || strings.Contains(out, b) {
					t.Fatalf("own key, own id: %s", out)
				}
				for _, args := range []string{
					"caller " + b,                      // another sandbox's id with its own key
					"caller " + b + " derive-for " + b, // a key "derived" from its own
					"caller " + a + " derive-for " + a,
					"caller " + a + " derive-for " + b,
				} {
					if out := probeAs(args); !strings.HasPrefix(out, "refused") {
						t.Errorf("selfprobe %s: %s; want refused", args, out)
					}
				}
				// An unprivileged user cannot read PID 1's key at all.
				if out, _ := s.run("exec", a, "--", "/tmp/selfprobe", "caller", a); !strings.HasPrefix(out, "nokey refused") {
					t.Fatalf("an unprivileged user authenticated on the channel: %s", out)
				}
			})

			t.Run("a flood does not stop another sandbox or the REST API", func(t *testing.T) {
				s.must("cp", probe, a+":/tmp/selfprobe")
				s.asRoot(a, "chmod 755 /tmp/selfprobe")
				const secs = 12
				done := make(chan string, 1)
				master, err := os.ReadFile(filepath.Join(s.dataDir, "channel.key"))
				if err != nil {
					t.Fatal(err)
				}
				// With the sandbox's own key: its slowloris callers hold real slots.
				key := "SELFPROBE_KEY=" + hex.EncodeToString(agentapi.DeriveKey(master, a))
				go func() {
					out, _ := s.run("exec", "--user", "root", a, "--", "env", key, "/tmp/selfprobe", "flood", fmt.Sprint(secs))
					done <- out
				}()
				time.Sleep(2 * time.Second) // the flood is under way
				deadline := time.Now().Add((secs - 4) * time.Second)
				n, worst := 0, time.Duration(0)
				for time.Now().Before(deadline) {
					t0 := time.Now()
					if got := s.selfID(t, b, ""); got != b {
						t.Fatalf("B's GET self during the flood: %q", got)
					}
					if code, _ := s.api(s.key, "GET", "/v1/sandboxes/"+a, nil); code != 200 {
						t.Fatalf("REST GET of the flooding sandbox: %d", code)
					}
					worst = max(worst, time.Since(t0))
					n++
				}
				out := <-done
				t.Logf("%s flood from %s: %s; meanwhile %d rounds of B's GET self + REST GET, slowest %s", rt, a, strings.TrimSpace(out), n, worst)
				var counts map[string]int
				if err := json.Unmarshal([]byte(lastLine(out)), &counts); err != nil {
					t.Fatalf("flood output: %v: %s", err, out)
				}
				if counts["sent"] < 1000 {
					t.Errorf("the flood sent only %d requests", counts["sent"])
				}
				for k, v := range counts {
					if strings.HasPrefix(k, "big_2") && v > 0 {
						t.Errorf("a 2 MiB body was accepted (%s: %d)", k, v)
					}
				}
				// How many hit the rate limit (429) depends on the host's speed:
				// the bucket itself is TestSelfRate's.
				waitSelf(t, s, a) // the flooding sandbox gets its API back
			})

			t.Run("memory pause with the socket in use, then resume", func(t *testing.T) {
				s.must("exec", a, "--", "sh", "-c",
					"rm -f /tmp/api.ok; (while true; do /.berth/berth-agent api GET /v1/sandboxes/self >/dev/null 2>>/tmp/api.err && echo ok >> /tmp/api.ok; done) >/dev/null 2>&1 &")
				okLines := func() int {
					out, _ := s.run("exec", a, "--", "sh", "-c", "wc -l < /tmp/api.ok")
					var n int
					fmt.Sscan(strings.TrimSpace(out), &n)
					return n
				}
				testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
					if okLines() < 3 {
						return fmt.Errorf("the API loop has not answered")
					}
					return nil
				})
				s.must("pause", a, "--mode", "memory")
				mode := wantMemoryPause(t, s, a, rt)
				t.Logf("%s: pause --mode memory with API calls in flight: %s", rt, mode)
				s.must("resume", a)
				if v := inspect(t, s, a); v.ResumedFrom != mode {
					log, _ := os.ReadFile(filepath.Join(s.dataDir, "sandboxes", a, "criu-restore", "restore.log"))
					var errLines []string
					for _, l := range strings.Split(string(log), "\n") {
						if strings.Contains(l, "Error") || strings.Contains(l, "rror (") {
							errLines = append(errLines, l)
						}
					}
					t.Fatalf("paused as %s, resumed from %q: %s\n%s", mode, v.ResumedFrom, v.Message, strings.Join(errLines, "\n"))
				}
				if got := s.selfID(t, a, ""); got != a {
					t.Fatalf("after resume GET self is %q", got)
				}
				if mode == "memory" { // the loop itself carried on
					n := okLines()
					testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
						if okLines() < n+3 {
							return fmt.Errorf("the API loop stopped answering after the restore")
						}
						return nil
					})
				}
				s.run("exec", "--user", "root", a, "--", "sh", "-c", "pkill -f 'api GET' ; pkill sh; true")
			})

			t.Run("fork: the child is itself", func(t *testing.T) {
				res := s.fork(a, 1)
				child := res.Sandboxes[0].ID
				defer s.run("rm", "-f", child)
				t.Logf("%s fork: mode %s", rt, res.Mode)
				if got := s.selfID(t, child, ""); got != child {
					t.Fatalf("in the fork %s GET self is %q", child, got)
				}
				if out, errOut, code := s.selfCall(child, "root", "GET", "/v1/sandboxes/"+a); code != 1 || !strings.Contains(errOut, "403") {
					t.Fatalf("the fork read its parent: exit %d %s %s", code, out, errOut)
				}
				if got := s.selfID(t, a, ""); got != a {
					t.Fatalf("the parent after the fork is %q", got)
				}
			})
		})
	}
}

func waitSelf(t *testing.T, s *server, id string) {
	t.Helper()
	testutil.Eventually(t, testutil.Within(20*time.Second).Every(200*time.Millisecond), func() error {
		out, errOut, code := s.selfCall(id, "", "GET", "/v1/sandboxes/self")
		if code != 0 || !strings.Contains(out, id) {
			return fmt.Errorf("GET self in %s: exit %d %s%s", id, code, out, errOut)
		}
		return nil
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
