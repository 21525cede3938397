package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSudoSetuidStaysInside: the default template's passwordless sudo works
// for the unprivileged user on runc (user namespace) and runsc (gVisor), and
// a setuid-root binary planted by sandbox root, which works inside, gives a
// host user nothing: it cannot reach the file by path, and handed the file
// itself (an open fd) it runs with its own uid from the workspace (nosuid)
// and, from a runc sandbox's root filesystem, at most as the sandbox's
// unprivileged mapped uid — never as host root.
func TestSudoSetuidStaysInside(t *testing.T) {
	tars, _ := filepath.Glob("/var/cache/berth/rootfs/default-*.tar")
	if len(tars) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("no default template in /var/cache/berth/rootfs (scripts/setup.sh builds it)")
		}
		t.Skip("no default template in /var/cache/berth/rootfs")
	}
	s := startServer(t, "--no-default-template=false")
	rpWaitFor(t, 5*time.Minute, "template default to be ready", func() bool {
		out, _ := s.run("template", "ls")
		return containsLine(out, "default", "ready")
	})
	const nobody = 65534
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.must("create", "--template", "default", "--runtime", rt)
			if out := strings.TrimSpace(s.must("exec", id, "--", "id", "-u")); out != "1000" {
				t.Fatalf("exec runs as uid %q, want the template's user 1000", out)
			}
			// stdout only: sudo may warn on stderr that the sandbox's host name
			// is not in the template's /etc/hosts.
			if out, errOut, code := s.runSplit(s.key, nil, "exec", id, "--", "sudo", "-n", "id", "-u"); code != 0 || strings.TrimSpace(out) != "0" {
				t.Fatalf("sudo id -u = %q (exit %d, stderr %q), want 0", out, code, errOut)
			}
			if out, errOut, code := s.runSplit(s.key, nil, "exec", id, "--", "sudo", "-n", "sh", "-c", "echo ok > /root/by-sudo && cat /root/by-sudo"); code != 0 || strings.TrimSpace(out) != "ok" {
				t.Fatalf("sudo write: %q (exit %d, stderr %q)", out, code, errOut)
			}
			// The attack: sandbox root plants a setuid-root copy of id(1).
			s.must("exec", "--user", "root", id, "--", "sh", "-c", "cp /usr/bin/id /usr/local/bin/suid-id && chown 0:0 /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
			if out := strings.TrimSpace(s.must("exec", id, "--", "/usr/local/bin/suid-id", "-u")); out != "0" {
				t.Fatalf("planted setuid binary inside gives euid %q, want 0 (setuid works inside)", out)
			}
			dir := filepath.Join(s.dataDir, "sandboxes", id)
			planted := map[string]string{
				"workspace upper": filepath.Join(dir, "ws", "upper", "usr", "local", "bin", "suid-id"),
				"root filesystem": filepath.Join(dir, "rootfs", "usr", "local", "bin", "suid-id"),
			}
			for where, p := range planted {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatalf("%s: %v (the host sees the sandbox's writes there)", where, err)
				}
				if fi.Mode()&os.ModeSetuid == 0 {
					t.Fatalf("%s: %s is not setuid on the host (%v): the attack did not land", where, p, fi.Mode())
				}
				var st syscall.Stat_t
				_ = syscall.Stat(p, &st)
				// By path, as an unprivileged host user: refused.
				cmd := exec.Command(p, "-u")
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
				if out, err := cmd.CombinedOutput(); err == nil {
					t.Errorf("%s: host uid %d ran %s by path: %q", where, nobody, p, out)
				}
				// Handed the file itself: runs unprivileged.
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				cmd = exec.Command("/proc/self/fd/3", "-u")
				cmd.ExtraFiles = []*os.File{f}
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
				out, err := cmd.CombinedOutput()
				f.Close()
				if err != nil {
					t.Logf("%s: exec through an fd as uid %d: %v %s (refused)", where, nobody, err, out)
					continue
				}
				euid, err := strconv.Atoi(strings.TrimSpace(string(out)))
				if err != nil {
					t.Fatalf("%s: id -u printed %q", where, out)
				}
				switch {
				case euid == 0:
					t.Errorf("%s: planted setuid binary (host owner uid %d) gave host root", where, st.Uid)
				case where == "workspace upper" && euid != nobody:
					t.Errorf("%s: euid %d, want %d (the workspace mount is nosuid)", where, euid, nobody)
				case euid != nobody && (rt != "runc" || euid < mappedRoot):
					t.Errorf("%s: euid %d: setuid honoured on the host outside the sandbox's mapping", where, euid)
				}
				t.Logf("%s: host owner uid %d, exec as uid %d → euid %d", where, st.Uid, nobody, euid)
			}
			// The guards themselves: the workspace is nosuid everywhere; the
			// root overlay is nosuid on runsc (the Sentry does setuid) and
			// nodev only on user-namespaced runc (its setuid stays in the mapping).
			if o := mountOptions(t, filepath.Join(dir, "ws")); !hasOpt(o, "nosuid") || !hasOpt(o, "nodev") {
				t.Errorf("workspace mounted %s, want nosuid,nodev", o)
			}
			o := mountOptions(t, filepath.Join(dir, "rootfs"))
			if !hasOpt(o, "nodev") || hasOpt(o, "nosuid") != (rt == "runsc") {
				t.Errorf("%s root overlay mounted %s", rt, o)
			}
			s.must("rm", id)
		})
	}
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}
