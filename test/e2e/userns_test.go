package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mappedRoot is the host uid root of a runc sandbox maps to (daemon/userns.go).
const mappedRoot = 2000000000

// hostOwner is the owner uid:gid of path on the host, without following a symlink.
func hostOwner(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

// sandboxHostUIDs are the real, effective, saved and fs uids, as the host
// sees them, of every process in a runc sandbox's cgroup.
func sandboxHostUIDs(t *testing.T, id string) map[int]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/berth", id, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // exited meanwhile
		}
		for _, line := range strings.Split(string(st), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				out[pid] = strings.Join(strings.Fields(rest), " ")
			}
		}
	}
	return out
}

// TestRuncUserNamespace attacks from inside a runc sandbox as root and checks
// that root there is an unprivileged host uid: its processes, the files it
// writes (a planted setuid binary included), while everything root inside
// needs still works, and captured layers come back unshifted.
func TestRuncUserNamespace(t *testing.T) {
	s := startServer(t)

	var info struct {
		Runtimes []struct {
			Name      string `json:"name"`
			Isolation string `json:"isolation"`
			UserNS    *struct {
				HostID uint32 `json:"host_id"`
			} `json:"userns"`
		} `json:"runtimes"`
	}
	if err := json.Unmarshal([]byte(s.must("info", "--json")), &info); err != nil {
		t.Fatal(err)
	}
	for _, r := range info.Runtimes {
		want := map[string]string{"runc": "namespaces+userns+seccomp", "runsc": "gVisor"}[r.Name]
		if r.Isolation != want {
			t.Errorf("info: %s isolation %q, want %q", r.Name, r.Isolation, want)
		}
		if r.Name == "runc" && (r.UserNS == nil || r.UserNS.HostID != mappedRoot) {
			t.Errorf("info: runc userns %+v, want host id %d", r.UserNS, mappedRoot)
		}
	}
	if out := s.must("info"); !strings.Contains(out, "namespaces+userns+seccomp") {
		t.Errorf("berth info does not say how runc isolates:\n%s", out)
	}

	id := s.create()
	upper := filepath.Join(s.dataDir, "sandboxes", id, "ws", "upper")
	if out := s.must("exec", "--user", "root", id, "--", "cat", "/proc/self/uid_map"); strings.Join(strings.Fields(out), " ") != fmt.Sprintf("0 %d 65536", mappedRoot) {
		t.Fatalf("uid_map inside: %q", out)
	}
	// Root plants what would be an escape if root inside were root outside.
	s.must("exec", "--user", "root", "--cwd", "/", id, "--", "sh", "-c",
		"echo x > /root/by-root && cp /bin/busybox /root/suid && chmod 4755 /root/suid && "+
			"mkdir -p /home/user/w && echo y > /home/user/w/f && chown -R 1000:1000 /home/user/w && "+
			"echo '10.9.9.9 planted' >> /etc/hosts")
	s.must("exec", "--user", "root", id, "--", "sh", "-c", "sleep 600 >/dev/null 2>&1 &")
	for rel, want := range map[string]string{
		"root/by-root":  fmt.Sprintf("%d:%d", mappedRoot, mappedRoot),
		"root/suid":     fmt.Sprintf("%d:%d", mappedRoot, mappedRoot),
		"home/user/w/f": fmt.Sprintf("%d:%d", mappedRoot+1000, mappedRoot+1000),
		"etc/hosts":     fmt.Sprintf("%d:%d", mappedRoot, mappedRoot),
	} {
		if got := hostOwner(t, filepath.Join(upper, rel)); got != want {
			t.Errorf("host upper %s owned by %s, want %s (the unprivileged mapped ids)", rel, got, want)
		}
	}
	uids := sandboxHostUIDs(t, id)
	if len(uids) < 2 {
		t.Fatalf("sandbox processes on the host: %v (want the agent and the planted sleep)", uids)
	}
	for pid, u := range uids {
		for _, f := range strings.Fields(u) {
			if f == "0" {
				t.Errorf("sandbox process %d runs as host uid 0 (Uid: %s)", pid, u)
			}
		}
	}
	// Root inside is still root for everything in its sandbox.
	if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "id -u; stat -c '%u:%g' /root/by-root /home/user/w/f; chown 1000:1000 /root/by-root && stat -c %u /root/by-root; grep -c planted /etc/hosts"); out != "0\n0:0\n1000:1000\n1000\n1" {
		t.Errorf("root inside sees:\n%s", out)
	}
	if out := s.must("exec", "--user", "user", id, "--", "sh", "-c", "id -u; touch /home/user/w/g && stat -c %U /home/user/w/g; touch /etc/nope 2>/dev/null || echo denied"); out != "1000\nuser\ndenied" {
		t.Errorf("--user user sees:\n%s", out)
	}
	if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "test -r /.berth/berth-agent && echo agent-readable; touch /sys/x 2>/dev/null || echo sys-ro; cat /proc/kcore 2>/dev/null | head -c1 | wc -c"); out != "agent-readable\nsys-ro\n0" {
		t.Errorf("agent dir, /sys, masked paths:\n%s", out)
	}
	local := filepath.Join(t.TempDir(), "up")
	if err := os.WriteFile(local, []byte("via the files API"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.must("cp", local, id+":/home/user/w/up")
	if out := s.must("exec", id, "--", "stat", "-c", "%U", "/home/user/w/up"); out != "user" {
		t.Errorf("file uploaded through the files API owned by %q inside, want user", out)
	}
	if got := hostOwner(t, filepath.Join(upper, "home/user/w/up")); got != fmt.Sprintf("%d:%d", mappedRoot+1000, mappedRoot+1000) {
		t.Errorf("uploaded file on the host: %s", got)
	}

	// A snapshot layer holds the ids as seen inside: a lower for anybody.
	var snap struct {
		ID     string   `json:"id"`
		Layers []string `json:"layers"`
	}
	if err := json.Unmarshal([]byte(s.must("snapshot", id, "--json")), &snap); err != nil || len(snap.Layers) < 2 {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	layer := filepath.Join(s.dataDir, "layers", strings.TrimPrefix(snap.Layers[0], "sha256:"))
	if _, err := os.Stat(layer); err != nil {
		layer = filepath.Join(s.dataDir, "layers", snap.Layers[0])
	}
	for rel, want := range map[string]string{"root/by-root": "1000:1000", "root/suid": "0:0", "home/user/w/f": "1000:1000"} {
		if got := hostOwner(t, filepath.Join(layer, rel)); got != want {
			t.Errorf("snapshot layer %s owned by %s, want %s (unshifted)", rel, got, want)
		}
	}
	kid := s.must("create", "--from-snapshot", snap.ID)
	if out := s.must("exec", "--user", "root", kid, "--", "sh", "-c", "stat -c '%u:%g %a' /root/by-root /root/suid /home/user/w/f; cat /proc/self/uid_map | wc -l"); out != "1000:1000 644\n0:0 4755\n1000:1000 644\n1" {
		t.Errorf("sandbox from the snapshot sees:\n%s", out)
	}
	// Stop/start and a disk pause remount the workspace with the same mapping.
	s.must("stop", id)
	s.must("start", id)
	s.must("pause", id, "--mode", "disk")
	s.must("resume", id)
	if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "stat -c %u /root/by-root /home/user/w/f; awk '{print $2}' /proc/self/uid_map"); out != fmt.Sprintf("1000\n1000\n%d", mappedRoot) {
		t.Errorf("after stop/start and a disk pause:\n%s", out)
	}
}

// TestRuncUserNamespaceLifecycle: what else a user-namespaced runc sandbox
// goes through keeps working — a template build whose RUN step makes files
// for root and for uid 1000 (the captured layer is unshifted and a sandbox
// from it sees those owners), a memory fork whose child keeps the parent's
// processes in a netns of its own, a memory pause whose processes carry on
// (both where runc can checkpoint here) — and a sandbox made without a user
// namespace stays without one after the daemon gets it back.
func TestRuncUserNamespaceLifecycle(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"Dockerfile": "FROM tiny\n" +
		"RUN mkdir -p /srv/app && echo r > /srv/app/rootfile && echo u > /srv/app/userfile && chown 1000:1000 /srv/app/userfile && chmod 4755 /srv/app/rootfile\n"})
	if out, code := s.run("template", "build", "-t", "owned", ctxDir); code != 0 {
		t.Fatalf("template build: exit %d: %s", code, out)
	}
	id := s.must("create", "--template", "owned")
	if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "stat -c '%u:%g %a' /srv/app /srv/app/rootfile /srv/app/userfile; awk '{print $2}' /proc/self/uid_map"); out != fmt.Sprintf("0:0 755\n0:0 4755\n1000:1000 644\n%d", mappedRoot) {
		t.Errorf("sandbox from the built template sees:\n%s", out)
	}
	var tpls []struct {
		Name   string   `json:"name"`
		Layers []string `json:"layers"`
	}
	if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &tpls); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tpls {
		if tp.Name != "owned" || len(tp.Layers) == 0 {
			continue
		}
		layer := filepath.Join(s.dataDir, "layers", tp.Layers[0])
		if _, err := os.Stat(layer); err != nil {
			layer = filepath.Join(s.dataDir, "layers", strings.TrimPrefix(tp.Layers[0], "sha256:"))
		}
		for rel, want := range map[string]string{"srv/app/rootfile": "0:0", "srv/app/userfile": "1000:1000"} {
			if got := hostOwner(t, filepath.Join(layer, rel)); got != want {
				t.Errorf("built layer %s owned by %s on the host, want %s (unshifted)", rel, got, want)
			}
		}
	}

	s.must("exec", "--user", "root", id, "--", "sh", "-c", "echo mine > /root/m && chown 1000 /root/m")
	// Memory checkpoints: CRIU runs in the sandbox's (daemon-made) netns,
	// so a fork child and a resumed sandbox keep their processes.
	memory := checkpointCaps(t, s, "runc").Checkpoint
	if !memory && os.Getenv("CI") == "true" {
		t.Fatalf("runc cannot checkpoint here: %s", checkpointCaps(t, s, "runc").CheckpointReason)
	}
	startCounter(t, s, id)
	pid := counterPid(s, id)
	res := s.fork(id, 1)
	kid := res.Sandboxes[0].ID
	if memory {
		if res.Mode != "memory" {
			t.Errorf("fork of a userns runc sandbox: mode %q (%s), want memory", res.Mode, res.Reason)
		}
		if got := counterPid(s, kid); got != pid {
			t.Errorf("fork child's counter process %q, parent's %q", got, pid)
		}
		waitCounter(t, s, kid, counter(s, kid)+2)
		// The child runs in its own netns (its own eth0 address), not the parent's.
		if a, b := s.must("exec", id, "--", "cat", "/proc/net/fib_trie"), s.must("exec", kid, "--", "cat", "/proc/net/fib_trie"); a == b || !strings.Contains(b, "LOCAL") {
			t.Errorf("fork child's routes are the parent's:\n%s", b)
		}
	}
	if out := s.must("exec", "--user", "root", kid, "--", "sh", "-c", "stat -c %u /root/m /srv/app/userfile; awk '{print $2}' /proc/self/uid_map"); out != fmt.Sprintf("1000\n1000\n%d", mappedRoot) {
		t.Errorf("fork child sees:\n%s", out)
	}

	s.must("pause", id, "--mode", "memory")
	want := wantMemoryPause(t, s, id, "runc")
	s.must("resume", id)
	if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "stat -c %u /root/m; awk '{print $2}' /proc/self/uid_map"); out != fmt.Sprintf("1000\n%d", mappedRoot) {
		t.Errorf("after the %s pause: %q", want, out)
	}
	if want == "memory" {
		if got := counterPid(s, id); got != pid {
			t.Errorf("counter process %q after a memory pause, was %q", got, pid)
		}
		waitCounter(t, s, id, counter(s, id)+2)
	}

	// A server without user namespaces, then the default again: its sandbox
	// keeps running unmapped, new ones are mapped.
	plain := startServer(t, "--no-userns")
	if out := plain.must("info"); !strings.Contains(out, "namespaces+seccomp") || strings.Contains(out, "userns") {
		t.Errorf("berth info with --no-userns:\n%s", out)
	}
	old := plain.create()
	plain.must("exec", "--user", "root", old, "--", "sh", "-c", "echo old > /root/o")
	full := "0 0 4294967295"
	if out := plain.must("exec", "--user", "root", old, "--", "cat", "/proc/self/uid_map"); strings.Join(strings.Fields(out), " ") != full {
		t.Fatalf("--no-userns sandbox uid_map %q", out)
	}
	plain.must("stop", old)
	plain.stop()
	plain.extra = nil
	plain.start()
	plain.must("start", old)
	if out := plain.must("exec", "--user", "root", old, "--", "sh", "-c", "cat /root/o; stat -c %u /root/o; cat /proc/self/uid_map"); strings.Join(strings.Fields(out), " ") != "old 0 "+full {
		t.Errorf("pre-userns sandbox after the switch: %q", out)
	}
	fresh := plain.create()
	if out := plain.must("exec", "--user", "root", fresh, "--", "awk", "{print $2}", "/proc/self/uid_map"); out != strconv.Itoa(mappedRoot) {
		t.Errorf("new sandbox after the switch: uid_map host id %q", out)
	}
}
