package e2e

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/testutil"
)

// fakeAgentBin builds testdata/fakeagent (static) once per test process.
func fakeAgentBin(t *testing.T) string {
	return testutil.BuildProgram(t, "./test/e2e/testdata/fakeagent")
}

// asRoot runs a shell script as root inside a sandbox.
func (s *server) asRoot(id, script string) (string, int) {
	return s.run("exec", "--user", "root", id, "--", "sh", "-c", script)
}

// canary is a host file no sandbox may change; it reports whether it did.
type canary struct {
	path string
	mod  time.Time
}

func newCanary(t *testing.T) canary {
	p := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(p, []byte("canary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	return canary{path: p, mod: fi.ModTime()}
}

func (c canary) check(t *testing.T, when string) {
	t.Helper()
	b, err := os.ReadFile(c.path)
	fi, _ := os.Lstat(c.path)
	if err != nil || string(b) != "canary\n" || fi == nil || !fi.Mode().IsRegular() || !fi.ModTime().Equal(c.mod) {
		t.Fatalf("%s: host canary %s changed: %q, %v", when, c.path, b, err)
	}
}

// chanDir is the host side of a sandbox's channel dir: on the shared
// channel tmpfs (DATA/chan/ID), or the sandbox's own (made without it).
func (s *server) chanDir(id string) string {
	if fi, err := os.Lstat(filepath.Join(s.dataDir, "chan", id)); err == nil && fi.IsDir() {
		return filepath.Join(s.dataDir, "chan", id)
	}
	return filepath.Join(s.dataDir, "sandboxes", id, "chan")
}

// chanEntries lists the host side of a sandbox's channel dir.
func (s *server) chanEntries(t *testing.T, id string) []string {
	t.Helper()
	entries, err := os.ReadDir(s.chanDir(id))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func daemonRSSMiB(t *testing.T, s *server) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatalf("daemon gone: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return -1
}

func (s *server) healthy(t *testing.T) {
	t.Helper()
	resp, err := http.Get(s.url + "/v1/health")
	if err != nil {
		t.Fatalf("daemon not answering: %v", err)
	}
	resp.Body.Close()
}

// TestChannelTrustBoundary attacks the agent channel from inside real
// sandboxes, as root, on runc and runsc: the channel dir is read-only, no
// planted symlink makes the daemon write a host file, an agent without the
// key is refused, one with the key cannot make the daemon read more than
// its bounds, and nothing of it reaches another tenant.
func TestChannelTrustBoundary(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	defer s.stopRunsc()
	fake := fakeAgentBin(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			a, b := s.create("--runtime", rt), s.create("--runtime", rt)
			defer s.run("rm", "-f", a)
			defer s.run("rm", "-f", b)
			envBefore, err := os.ReadFile(filepath.Join(s.chanDir(a), "env.json"))
			if err != nil {
				t.Fatal(err)
			}

			t.Run("channel dir is read-only", func(t *testing.T) {
				for _, script := range []string{
					"echo x > /run/berth/pwn",
					"mkdir /run/berth/d",
					"ln -s /etc /run/berth/l",
					"rm -f /run/berth/agent.sock",
					"mv /run/berth/env.json /run/berth/e",
					"echo '{\"X\":\"1\"}' >> /run/berth/env.json",
					"dd if=/dev/zero of=/run/berth/big bs=1M count=8",
					"mount -o remount,rw /run/berth",
				} {
					if out, code := s.asRoot(a, script); code == 0 {
						t.Errorf("%q succeeded inside the sandbox: %s", script, out)
					}
				}
				if got := s.chanEntries(t, a); !slices.Equal(got, []string{"agent.sock", "env.json"}) {
					t.Errorf("host channel dir holds %v, want only agent.sock and env.json", got)
				}
				if after, _ := os.ReadFile(filepath.Join(s.chanDir(a), "env.json")); string(after) != string(envBefore) {
					t.Errorf("env.json changed from inside: %q", after)
				}
				if _, err := os.Lstat(filepath.Join(s.dataDir, "sandboxes", a, "run")); err == nil {
					t.Error("the old sandbox-writable run dir exists")
				}
			})

			t.Run("planted symlinks make the daemon write no host file", func(t *testing.T) {
				c := newCanary(t)
				// Every path the old code wrote through, and the agent's own files.
				plant := ""
				for _, p := range []string{"/run/berth/env.json.tmp", "/run/berth/env.json", "/run/berth/runtime.log",
					"/run/berth/agent.sock", "/run/berth/restore-count", "/run/berth/on-restore.log"} {
					if out, code := s.asRoot(a, "ln -sf "+c.path+" "+p); code == 0 {
						t.Errorf("planted a symlink at %s: %s", p, out)
					}
				}
				plant += "mkdir -p /var/lib/berth-agent && ln -sf " + c.path + " /var/lib/berth-agent/restore-count && ln -sf " + c.path + " /var/lib/berth-agent/on-restore.log"
				s.asRoot(a, plant)
				steps := [][]string{{"stop", a}, {"start", a}, {"pause", a, "--mode", "disk"}, {"resume", a},
					{"pause", a, "--mode", "freeze"}, {"resume", a}}
				if rt == "runsc" { // runc memory pauses are issue 12's (CRIU on this host)
					steps = append(steps, []string{"pause", a, "--mode", "memory"}, []string{"resume", a})
				}
				for _, step := range steps {
					s.must(step...)
					c.check(t, strings.Join(step, " "))
				}
				if out := s.must("exec", a, "--", "hostname"); out != a {
					t.Fatalf("after the lifecycle hostname = %q, want %q", out, a)
				}
				nb := s.create("--runtime", rt) // and a create next to it
				s.run("rm", "-f", nb)
				c.check(t, "create/rm")
				if got := s.chanEntries(t, a); !slices.Equal(got, []string{"agent.sock", "env.json"}) {
					t.Errorf("host channel dir holds %v after the lifecycle", got)
				}
			})

			t.Run("agent without the key is refused", func(t *testing.T) {
				s.must("cp", fake, a+":/tmp/fakeagent")
				s.must("exec", "--user", "root", a, "--", "chmod", "755", "/tmp/fakeagent")
				out, code := s.asRoot(a, "/tmp/fakeagent nokey /run/berth/agent.sock")
				if code != 0 || !strings.Contains(out, "accepted=0 ") {
					t.Fatalf("fake agent without the key: exit %d: %s", code, out)
				}
				s.healthy(t)
				if out := s.must("exec", a, "--", "hostname"); out != a {
					t.Fatalf("real agent after the flood: hostname %q", out)
				}
				if out := s.must("exec", b, "--", "hostname"); out != b {
					t.Fatalf("other tenant after the flood: hostname %q", out)
				}
			})

			t.Run("agent with the key gets bounded", func(t *testing.T) {
				// The sandbox's own key, as a root inside that learnt it would hold it.
				master, err := os.ReadFile(filepath.Join(s.dataDir, "channel.key"))
				if err != nil {
					t.Fatal(err)
				}
				key := hex.EncodeToString(agentapi.DeriveKey(master, a))
				// A restart drops the daemon's kept-alive agent connections,
				// so the execs below cannot all ride on old ones.
				s.must("stop", a)
				s.must("start", a)
				s.must("cp", fake, a+":/tmp/fakeagent")
				s.must("exec", "--user", "root", a, "--", "chmod", "755", "/tmp/fakeagent")
				s.asRoot(a, "/tmp/fakeagent key /run/berth/agent.sock "+key+" >/dev/null 2>&1 &")
				// The fake agent's connection waits among the real agent's
				// spares (the daemon takes the oldest first). Execs that
				// overlap for a second need a connection each: more of them
				// than the daemon keeps alive make it take spares until it
				// meets the fake one (more each round, below MaxConns).
				bounded := 0
				var outs []string
				for i := 0; i < 8 && bounded == 0; i++ {
					var mu sync.Mutex
					var wg sync.WaitGroup
					for j := 0; j < 6+4*i; j++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							out, code := s.run("exec", a, "--", "sh", "-c", "sleep 1; echo hi")
							mu.Lock()
							defer mu.Unlock()
							if code != 0 && strings.Contains(out, "exceeds") {
								bounded++
							}
							outs = append(outs, fmt.Sprintf("exit %d: %.200s", code, out))
						}()
					}
					wg.Wait()
					time.Sleep(50 * time.Millisecond)
				}
				if bounded == 0 {
					t.Fatalf("the 1 GiB answer never met a bound:\n%s", strings.Join(outs, "\n"))
				}
				s.healthy(t)
				if rss := daemonRSSMiB(t, s); rss > 512 {
					t.Errorf("daemon RSS %d MiB after a 1 GiB answer", rss)
				}
				if out := s.must("exec", b, "--", "hostname"); out != b {
					t.Fatalf("other tenant while A's fake agent runs: hostname %q", out)
				}
			})
		})
	}

	t.Run("cross-tenant after a daemon restart", func(t *testing.T) {
		type pair struct{ a, b string }
		var pairs []pair
		for _, rt := range []string{"runc", "runsc"} {
			p := pair{s.create("--runtime", rt), s.create("--runtime", rt)}
			pairs = append(pairs, p)
			// The other sandbox's socket is where the data dir says; A cannot point at it.
			other := filepath.Join(s.chanDir(p.b), "agent.sock")
			for _, script := range []string{
				"rm -f /run/berth/agent.sock && ln -s " + other + " /run/berth/agent.sock",
				"ln -sf ../../chan/" + p.b + "/agent.sock /run/berth/agent.sock",
				"ln -sf ../../sandboxes/" + p.b + "/chan/agent.sock /run/berth/agent.sock",
				"mount --bind /tmp /run/berth",
			} {
				if out, code := s.asRoot(p.a, script); code == 0 {
					t.Errorf("%s: %q succeeded: %s", rt, script, out)
				}
			}
		}
		s.kill9()
		s.start()
		for _, p := range pairs {
			if out := s.must("exec", p.a, "--", "hostname"); out != p.a {
				t.Fatalf("exec A -- hostname = %q, want A %q (B is %q)", out, p.a, p.b)
			}
			if out := s.must("exec", p.a, "--", "sh", "-c", "echo $BERTH_SANDBOX_ID"); out != p.a {
				t.Fatalf("BERTH_SANDBOX_ID in A = %q", out)
			}
			s.must("exec", p.a, "--", "sh", "-c", "echo fromA > /tmp/xa")
			if out, code := s.run("exec", p.b, "--", "cat", "/tmp/xa"); code == 0 {
				t.Fatalf("a file written through A appears in B: %q", out)
			}
			if out := s.must("exec", p.b, "--", "hostname"); out != p.b {
				t.Fatalf("exec B -- hostname = %q, want %q", out, p.b)
			}
		}
	})
}

// TestForkRekeyAcrossRestart: a memory fork's child is rekeyed before it is
// handed out, so after a daemon restart (its agent redials with what it
// holds then) it still authenticates, as itself.
func TestForkRekeyAcrossRestart(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	defer s.stopRunsc()
	parent := s.create("--runtime", "runsc")
	res := s.fork(parent, 2)
	if res.Mode != "memory" {
		t.Fatalf("runsc fork mode %q (%s), want memory", res.Mode, res.Reason)
	}
	s.kill9()
	s.start()
	for _, c := range []string{parent, res.Sandboxes[0].ID, res.Sandboxes[1].ID} {
		if out := s.must("exec", c, "--", "sh", "-c", "hostname; echo $BERTH_SANDBOX_ID"); out != c+"\n"+c {
			t.Fatalf("%s after a restart: %q", c, out)
		}
	}
	// A fork of the fork: the image's agent is the child, rekeyed to itself.
	g := s.fork(res.Sandboxes[0].ID, 1)
	if g.Mode != "memory" {
		t.Fatalf("second-generation fork mode %q (%s)", g.Mode, g.Reason)
	}
	gc := g.Sandboxes[0].ID
	s.kill9()
	s.start()
	if out := s.must("exec", gc, "--", "sh", "-c", "hostname; echo $BERTH_SANDBOX_ID"); out != gc+"\n"+gc {
		t.Fatalf("grandchild after a restart: %q", out)
	}
}
