package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testutil"
)

// Issue 11: nothing a sandbox writes reaches the host. These tests plant
// the attack from inside real sandboxes as root, on runc and on runsc.

// euidProbe builds a static program that prints its effective uid.
func euidProbe(t *testing.T) string {
	t.Helper()
	return testutil.BuildProgram(t, "./test/e2e/testdata/euid")
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
		if why := notPrivateDir(filepath.Join(s.dataDir, d)); why != "" {
			t.Errorf("data dir %q: %s", d, why)
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
			if got := s.must("exec", "--user", "user", id, "--", "/home/user/euid"); got != "0" {
				// Inside, setuid works (sudo): the user namespace (runc) or
				// the Sentry (runsc) keeps it inside (SECURITY.md, sudo_test.go).
				t.Errorf("the planted program gives the sandbox's user euid %s inside, want 0 (setuid honoured inside)", got)
			}

			dir := filepath.Join(s.dataDir, "sandboxes", id)
			for _, m := range []string{filepath.Join(dir, "ws"), filepath.Join(dir, "rootfs")} {
				opts := strings.Split(mountOptions(t, m), ",")
				// A user-namespaced runc sandbox's own root overlay is nodev
				// only, so setuid works inside; it maps to its unprivileged
				// root at most (checked below).
				wantNosuid := rt == "runsc" || m != filepath.Join(dir, "rootfs")
				if contains(opts, "nosuid") != wantNosuid || !contains(opts, "nodev") {
					t.Errorf("%s is mounted %v, want nodev and nosuid=%v", m, opts, wantNosuid)
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
				want := "65534"
				if rt == "runc" && p == viaRootfs {
					// Through the runc sandbox's root overlay (not nosuid) the
					// file's host owner is the mapped root: an unprivileged uid.
					want = strconv.Itoa(mappedRoot)
				}
				if got := execAsNobody(t, p); got != want {
					t.Errorf("the planted setuid program at %s gives nobody euid %s, want %s", p, got, want)
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

// notPrivateDir says why dir is open to local users: it must be 0700, or
// 0710 with its group the user-namespace range's root (runc's init, as that
// uid, must reach the rootfs through it; nobody else gets any bit).
func notPrivateDir(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err.Error()
	}
	perm := st.Mode & 0o7777
	if perm == 0o700 || (perm == 0o710 && st.Gid == mappedRoot) {
		return ""
	}
	return fmt.Sprintf("mode %o group %d; want 0700, or 0710 with group %d (the user namespace's root)", perm, st.Gid, mappedRoot)
}
