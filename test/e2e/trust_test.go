package e2e

import (
	"bytes"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	_ "modernc.org/sqlite"

	"github.com/berth-dev/berth/internal/testutil"
)

// Issue 11: nothing a sandbox writes reaches the host. These tests plant
// the attack from inside real sandboxes as root, on runc and on runsc.

var euidOnce struct {
	sync.Once
	path string
	err  error
}

// euidProbe builds a static program that prints its effective uid.
func euidProbe(t *testing.T) string {
	t.Helper()
	euidOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-euid-")
		if err != nil {
			euidOnce.err = err
			return
		}
		euidOnce.path = filepath.Join(dir, "euid")
		cmd := exec.Command("go", "build", "-o", euidOnce.path, "./test/e2e/testdata/euid")
		cmd.Dir = testutil.RepoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			euidOnce.err = fmt.Errorf("build euid: %v: %s", err, out)
		}
	})
	if euidOnce.err != nil {
		t.Fatal(euidOnce.err)
	}
	return euidOnce.path
}

// runtimesOf lists the runtimes to attack from: runc, and runsc (a missing
// runsc fails in CI, skips elsewhere).
func runtimesOf(t *testing.T, s *server) []string {
	t.Helper()
	rts := []string{"runc"}
	if strings.Contains(s.must("info"), "runsc") {
		rts = append(rts, "runsc")
	} else {
		testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
	}
	return rts
}

// mountOptions returns the per-mount options of the mount at path.
func mountOptions(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	opts := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == path {
			opts = f[5] // the last (top) mount wins
		}
	}
	if opts == "" {
		t.Fatalf("nothing is mounted at %s", path)
	}
	return opts
}

// asNobody runs argv as uid/gid 65534 with no groups; extra become fds 3...
func asNobody(t *testing.T, extra []*os.File, argv ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, argv...)...)
	cmd.ExtraFiles = extra
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// execAsNobody executes the file at path as nobody through a descriptor the
// test (root) opened, so directory permissions do not matter: only the
// file's own setuid bit and its mount's nosuid do. It returns the euid the
// program reports.
func execAsNobody(t *testing.T, path string) string {
	t.Helper()
	out, err := tryExecAsNobody(t, path)
	if err != nil {
		t.Fatalf("run %s as nobody: %v: %s", path, err, out)
	}
	return out
}

func tryExecAsNobody(t *testing.T, path string) (string, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return asNobody(t, []*os.File{f}, "/proc/self/fd/3")
}

// deviceNodes lists what in dir is a device node, whiteouts (char 0/0) aside,
// and the whiteouts separately.
func deviceNodes(t *testing.T, dir string) (devices, whiteouts []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				whiteouts = append(whiteouts, rel)
			} else {
				devices = append(devices, fmt.Sprintf("%s (char %d:%d)", rel, unix.Major(st.Rdev), unix.Minor(st.Rdev)))
			}
		case unix.S_IFBLK:
			devices = append(devices, rel+" (block)")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return devices, whiteouts
}

func checkLayer(t *testing.T, s *server, digest, what string) {
	t.Helper()
	dir := filepath.Join(s.dataDir, "layers", digest)
	devs, wh := deviceNodes(t, dir)
	if len(devs) > 0 {
		t.Errorf("%s layer %s holds device nodes the sandbox made: %v", what, digest, devs)
	}
	if !contains(wh, "bin/vi") {
		t.Errorf("%s layer %s lost the whiteout of the deleted /bin/vi (whiteouts: %v)", what, digest, wh)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSandboxFilesInertOnHost: a sandbox root plants a setuid-root program
// and device nodes in its workspace. On the host every mount of sandbox
// content is nosuid,nodev, the data dir is root's alone, the planted program
// gives nobody no root even when handed to it, the device node does not
// open, and snapshots and templates made from the sandbox keep no device
// node (but keep their whiteouts).
func TestSandboxFilesInertOnHost(t *testing.T) {
	testutil.RequireTool(t, "setpriv")
	s := startServer(t)
	probe := euidProbe(t)

	// Control: the same program, setuid root on an ordinary host mount,
	// does give nobody euid 0; so the checks below can fail.
	control := filepath.Join(t.TempDir(), "euid")
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(control, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(control, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if got := execAsNobody(t, control); got != "0" {
		t.Fatalf("control: a setuid-root program on the host gives nobody euid %s, want 0; the test cannot tell", got)
	}

	for _, d := range []string{"", "sandboxes", "layers", "snapshots"} {
		if fi, err := os.Stat(filepath.Join(s.dataDir, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("data dir %q: %v, %v; want 0700", d, fi.Mode(), err)
		}
	}

	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			// In /home/user: gVisor mounts its own tmpfs over an empty /tmp.
			s.must("cp", probe, id+":/home/user/euid")
			// /dev/null's numbers are in the device cgroup's allow list, so
			// runc lets root make it; a block device it refuses.
			out, _ := s.run("exec", "--user", "root", id, "--", "sh", "-c",
				"chown 0:0 /home/user/euid && chmod 4755 /home/user/euid && rm /bin/vi && "+
					"(mknod /home/user/null c 1 3 && echo MKNOD_OK) 2>&1; mknod /home/user/loop0 b 7 0 2>&1; ls -ln /home/user")
			mknod := strings.Contains(out, "MKNOD_OK")
			if !mknod {
				t.Logf("%s: mknod refused inside the sandbox: %s", rt, out)
				if _, code := s.run("exec", "--user", "root", id, "--", "test", "-e", "/home/user/null"); code == 0 {
					t.Fatalf("mknod reported failure but /root/null exists")
				}
			}
			if got := s.must("exec", "--user", "user", id, "--", "/home/user/euid"); got == "0" {
				// Inside, no-new-privileges ignores the setuid bit.
				t.Errorf("the planted program gives the sandbox's user euid 0 inside")
			}

			dir := filepath.Join(s.dataDir, "sandboxes", id)
			for _, m := range []string{filepath.Join(dir, "ws"), filepath.Join(dir, "rootfs")} {
				opts := strings.Split(mountOptions(t, m), ",")
				if !contains(opts, "nosuid") || !contains(opts, "nodev") {
					t.Errorf("%s is mounted %v, want nosuid and nodev", m, opts)
				}
			}
			upper := filepath.Join(dir, "ws", "upper")
			planted := filepath.Join(upper, "home", "user", "euid")
			fi, err := os.Stat(planted)
			if err != nil {
				t.Fatalf("the planted program is not in the host upper dir: %v", err)
			}
			if fi.Mode()&os.ModeSetuid == 0 {
				t.Fatalf("the planted program lost its setuid bit on the host (%v): the test cannot tell", fi.Mode())
			}

			// A local user can neither reach sandbox content...
			for _, p := range []string{filepath.Join(s.dataDir, "sandboxes"), dir, planted, filepath.Join(dir, "rootfs", "home", "user", "euid")} {
				if out, err := asNobody(t, nil, "stat", p); err == nil || !strings.Contains(out, "Permission denied") {
					t.Errorf("nobody can reach %s: %v: %s", p, err, out)
				}
			}
			// (through sh: setpriv itself resolves its program before it
			// drops privileges)
			if out, err := asNobody(t, nil, "sh", "-c", `exec "$0"`, planted); err == nil {
				t.Errorf("nobody ran the planted program by path: %s", out)
			}
			// ...nor gain root from the planted file when it is handed over.
			viaRootfs := filepath.Join(dir, "rootfs", "home", "user", "euid")
			if out, err := tryExecAsNobody(t, planted); err != nil && strings.Contains(out, "Text file busy") {
				// runsc's gofer keeps the file open for writing. The same
				// setuid-root program put on the same mount beside it (a new
				// inode nobody holds) tests the mount just as well.
				t.Logf("%s: %s; executing a setuid-root copy on the same mount", rt, out)
				copyOnMount := planted + ".copy"
				if err := os.WriteFile(copyOnMount, b, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(copyOnMount, os.ModeSetuid|0o755); err != nil {
					t.Fatal(err)
				}
				planted, viaRootfs = copyOnMount, viaRootfs+".copy"
			}
			for _, p := range []string{planted, viaRootfs} {
				if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeSetuid == 0 {
					t.Fatalf("%s is not setuid: %v, %v", p, fi, err)
				}
				if got := execAsNobody(t, p); got != "65534" {
					t.Errorf("the planted setuid program at %s gives nobody euid %s, want 65534", p, got)
				}
			}
			if mknod {
				for _, p := range []string{filepath.Join(upper, "home", "user", "null"), filepath.Join(dir, "rootfs", "home", "user", "null"), filepath.Join(upper, "home", "user", "loop0")} {
					if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
						continue // loop0: refused inside
					}
					f, err := os.OpenFile(p, os.O_RDONLY, 0)
					if err == nil {
						f.Close()
						t.Errorf("host root opened the sandbox's device node %s", p)
					} else if !errors.Is(err, unix.EACCES) {
						t.Errorf("open %s: %v, want EACCES (nodev)", p, err)
					}
				}
			}

			// Snapshots and templates made from it keep no device node.
			var snap struct {
				ID     string   `json:"id"`
				Layers []string `json:"layers"`
			}
			if err := json.Unmarshal([]byte(s.must("snapshot", id, "--json")), &snap); err != nil || len(snap.Layers) == 0 {
				t.Fatalf("snapshot: %v", err)
			}
			checkLayer(t, s, snap.Layers[0], "snapshot")
			tpl := "fromsnap-" + rt
			s.must("template", "from-snapshot", snap.ID, tpl)
			var tpls []struct {
				Name   string   `json:"name"`
				Layers []string `json:"layers"`
			}
			if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &tpls); err != nil {
				t.Fatal(err)
			}
			found := false
			for _, tp := range tpls {
				if tp.Name == tpl {
					found = true
					for _, l := range tp.Layers {
						if devs, _ := deviceNodes(t, filepath.Join(s.dataDir, "layers", l)); len(devs) > 0 {
							t.Errorf("template %s layer %s holds device nodes: %v", tpl, l, devs)
						}
					}
				}
			}
			if !found {
				t.Errorf("template %s not listed", tpl)
			}
			s.must("rm", "-f", id)
		})
	}

	t.Run("template build RUN", func(t *testing.T) {
		ctxDir := t.TempDir()
		df := "FROM tiny\nRUN rm /bin/vi && (mknod /null c 1 3 && mknod /loop0 b 7 0 || true) && echo built > /built\n"
		if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(df), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := s.run("template", "build", "-t", "devs", ctxDir); code != 0 {
			t.Fatalf("build: %s", out)
		}
		var tpls []struct {
			Name   string   `json:"name"`
			Layers []string `json:"layers"`
		}
		if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &tpls); err != nil {
			t.Fatal(err)
		}
		for _, tp := range tpls {
			if tp.Name == "devs" {
				checkLayer(t, s, tp.Layers[0], "RUN")
				return
			}
		}
		t.Fatal("template devs not listed")
	})
}

// TestHostNeverFollowsSandboxPaths: a sandbox root points the paths the
// host writes into its root filesystem (/etc/machine-id on fork, the trust
// bundle berth adds its egress CA to on every boot) at a host canary, by
// absolute and relative symlinks, through an intermediate directory, and as
// a FIFO. Forks, restarts and policy changes go on; the canary is untouched.
func TestHostNeverFollowsSandboxPaths(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			canaryDir := t.TempDir()
			canary := filepath.Join(canaryDir, "ca-certificates.crt")
			const text = "host canary\n"
			if err := os.WriteFile(canary, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			intact := func(when string) {
				t.Helper()
				if b, err := os.ReadFile(canary); err != nil || string(b) != text {
					t.Fatalf("%s: the host canary changed: %q, %v", when, b, err)
				}
				if ents, _ := os.ReadDir(canaryDir); len(ents) != 1 {
					t.Fatalf("%s: files appeared next to the canary: %v", when, ents)
				}
			}
			rel := strings.Repeat("../", 12) + strings.TrimPrefix(canary, "/")
			id := s.create("--runtime", rt)
			s.must("exec", "--user", "root", id, "--", "sh", "-c",
				"mkdir -p /etc/ssl/certs && ln -sfn "+canary+" /etc/ssl/certs/ca-certificates.crt && ln -sfn "+rel+" /etc/machine-id")

			s.fork(id, 1)
			intact("fork with /etc/machine-id a relative symlink")
			s.must("exec", "--user", "root", id, "--", "ln", "-sfn", canary, "/etc/machine-id")
			s.fork(id, 1)
			intact("fork with /etc/machine-id an absolute symlink")

			s.must("stop", id)
			s.must("start", id)
			intact("boot with the CA bundle an absolute symlink")

			s.must("exec", "--user", "root", id, "--", "sh", "-c", "ln -sfn "+rel+" /etc/ssl/certs/ca-certificates.crt")
			s.must("net", "set", id, "--allow", "example.com")
			s.must("stop", id)
			s.must("start", id)
			intact("boot with the CA bundle a relative symlink")

			s.must("exec", "--user", "root", id, "--", "sh", "-c", "rm -rf /etc/ssl/certs && ln -s "+canaryDir+" /etc/ssl/certs")
			s.must("stop", id)
			s.must("start", id)
			intact("boot with /etc/ssl/certs a symlink to the canary's directory")

			s.must("exec", "--user", "root", id, "--", "sh", "-c", "rm -f /etc/ssl/certs && mkdir /etc/ssl/certs && mkfifo /etc/ssl/certs/ca-certificates.crt")
			s.must("stop", id)
			s.must("start", id) // a FIFO is refused, not opened: the boot does not hang
			intact("boot with the CA bundle a FIFO")
			if out := s.must("exec", id, "--", "echo", "alive"); out != "alive" {
				t.Fatalf("sandbox after the attacks: %q", out)
			}

			// The host still adds its CA to a plain bundle.
			s.must("exec", "--user", "root", id, "--", "sh", "-c", "rm -f /etc/ssl/certs/ca-certificates.crt && echo '# bundle' > /etc/ssl/certs/ca-certificates.crt")
			s.must("stop", id)
			s.must("start", id)
			if out := s.must("exec", id, "--", "cat", "/etc/ssl/certs/ca-certificates.crt"); !strings.Contains(out, "BEGIN CERTIFICATE") {
				t.Errorf("the egress CA was not added to a regular bundle:\n%s", out)
			}
			s.must("rm", "-f", id)
		})
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
	if fi, err := os.Stat(s.dataDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v, %v; want 0700", fi.Mode(), err)
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

// TestBuildContextCannotWriteHost: a build context plants dest/foo as a
// symlink to a host directory through one COPY source and writes
// dest/foo/x through the next; the host directory is untouched.
func TestBuildContextCannotWriteHost(t *testing.T) {
	s := startServer(t)
	host := t.TempDir()
	canary := filepath.Join(host, "x")
	if err := os.WriteFile(canary, []byte("canary"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(host, 0o711); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{host, strings.Repeat("../", 12) + strings.TrimPrefix(host, "/")} {
		ctxDir := t.TempDir()
		for _, d := range []string{"a", "b/foo"} {
			if err := os.MkdirAll(filepath.Join(ctxDir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(target, filepath.Join(ctxDir, "a", "foo")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctxDir, "b", "foo", "x"), []byte("evil"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM tiny\nCOPY a b /dest/\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := s.run("template", "build", "--no-cache", "-t", "escape", ctxDir)
		t.Logf("build with dest/foo -> %s: exit %d", target, code)
		if b, err := os.ReadFile(canary); err != nil || string(b) != "canary" {
			t.Fatalf("the host file behind the symlink changed: %q, %v (build: %s)", b, err, out)
		}
		if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o711 {
			t.Fatalf("the host directory behind the symlink changed: %v, %v", fi.Mode(), err)
		}
	}
}
