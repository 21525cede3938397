package template

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// cacheDir is where template tars are cached across test runs; CI and
// scripts/setup.sh share it so the ~80 s debootstrap happens once per host.
func cacheDir() string {
	if d := os.Getenv("BERTH_CACHE_DIR"); d != "" {
		return filepath.Join(d, "rootfs")
	}
	return DefaultCacheDir
}

// inChroot runs a command inside an imported layer as uid/gid, returning
// its combined output.
func inChroot(t *testing.T, root string, uid uint32, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Path = args[0]
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", args, root, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestBuildTiny(t *testing.T) {
	requireRoot(t)
	_, err := os.Stat("/bin/busybox")
	requireHost(t, err == nil, "busybox-static (/bin/busybox)")
	ctx := context.Background()
	cache := t.TempDir()
	var steps []Progress
	p1, err := BuildTiny(ctx, cache, func(p Progress) { steps = append(steps, p) })
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) == 0 {
		t.Error("no progress reported")
	}
	p2, err := BuildTiny(ctx, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p1 != p2 {
		t.Fatalf("tiny tar is not reproducible: %s vs %s", p1, p2)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 2 { // tar + .sha256, no build leftovers
		t.Fatalf("cache dir holds %v", ents)
	}
	s := openStore(t)
	l, err := s.ImportFile(ctx, p1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p1), "tiny-"), ".tar"); !strings.HasPrefix(l.Digest, want) {
		t.Fatalf("layer %s does not match tar name %s", l.Digest, p1)
	}
	if got := inChroot(t, l.Path, 1000, "/bin/sh", "-c", "echo hello from $(id -u)"); got != "hello from 1000" {
		t.Fatalf("tiny sh: %q", got)
	}
	fi, err := os.Stat(filepath.Join(l.Path, "home/user"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("home/user: %v", err)
	}
}

func TestBuildDefault(t *testing.T) {
	requireRoot(t)
	_, err := lookTool("debootstrap")
	requireHost(t, err == nil, "debootstrap")
	if testing.Short() && os.Getenv("CI") != "true" && !fileExists(filepath.Join(cacheDir(), DefaultTarName())) {
		t.Skip("-short: not running debootstrap (~80 s)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	var last Progress
	var n int
	tarPath, err := BuildDefault(ctx, cacheDir(), func(p Progress) { last, n = p, n+1 })
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("default tar %s: %d MiB, built/reused in %s (%d progress steps, last %q)",
		tarPath, fi.Size()>>20, time.Since(start).Round(time.Millisecond), n, last.Message)
	if n == 0 {
		t.Error("no progress reported")
	}
	if filepath.Base(tarPath) != DefaultTarName() {
		t.Errorf("tar %s is not keyed by the recipe hash %s", tarPath, DefaultTarName())
	}

	s := openStore(t)
	start = time.Now()
	l, err := s.ImportFile(ctx, tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s: %d entries in %s", l.Digest[:12], l.Entries, time.Since(start).Round(time.Millisecond))
	root := l.Path

	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash\n") {
		t.Errorf("no user 1000 in /etc/passwd:\n%s", passwd)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/hostname")); string(b) != "localhost\n" {
		t.Errorf("hostname = %q", b)
	}
	for _, f := range []string{"etc/hostname", "etc/hosts", "etc/resolv.conf"} {
		if fi, err := os.Stat(filepath.Join(root, f)); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: %v %v, want mode 0644", f, fi, err)
		}
	}
	for _, d := range []string{"usr/share/man", "usr/share/info"} {
		if ents, _ := os.ReadDir(filepath.Join(root, d)); len(ents) != 0 {
			t.Errorf("%s not slimmed: %d entries", d, len(ents))
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/sudoers.d/user")); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("sudoers.d/user: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/sudo")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("sudo must stay setuid: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "home/user")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("home/user: %v", err)
	}
	if lists, _ := os.ReadDir(filepath.Join(root, "var/lib/apt/lists")); len(lists) != 0 {
		t.Errorf("apt lists not cleaned: %d entries", len(lists))
	}
	if debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb")); len(debs) != 0 {
		t.Errorf("apt archives not cleaned: %d debs", len(debs))
	}
	// The runtime provides /dev; a chroot needs at least /dev/null.
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "dev/null"), 0o666); err != nil { // mknod obeys the umask
		t.Fatal(err)
	}
	// The tools agents expect actually run (as the unprivileged user).
	for _, args := range [][]string{
		{"/usr/bin/python3", "-c", "print('py ok')"},
		{"/usr/bin/git", "--version"},
		{"/usr/bin/curl", "--version"},
		{"/bin/bash", "-c", "echo $BASH_VERSION; id -un"},
	} {
		out := inChroot(t, root, 1000, args...)
		if out == "" {
			t.Errorf("%v printed nothing", args)
		}
	}
	if out := inChroot(t, root, 0, "/usr/bin/sudo", "-l", "-U", "user"); !strings.Contains(out, "NOPASSWD: ALL") {
		t.Errorf("user has no passwordless sudo:\n%s", out)
	}
}

func TestBuildValidatesCacheDir(t *testing.T) {
	if _, err := BuildDefault(context.Background(), "", nil); errs.FieldOf(err) != "cache_dir" {
		t.Fatalf("BuildDefault(\"\") = %v", err)
	}
	if _, err := BuildTiny(context.Background(), "", nil); errs.FieldOf(err) != "cache_dir" {
		t.Fatalf("BuildTiny(\"\") = %v", err)
	}
}

func TestParseDebootstrapLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Progress
		ok   bool
	}{
		{"I: Retrieving libc6 2.36-9+deb12u10", Progress{Phase: PhaseDownload, Message: "Retrieving libc6 2.36-9+deb12u10"}, true},
		{"I: Extracting bash...", Progress{Phase: PhaseExtract, Message: "Extracting bash"}, true},
		{"I: Unpacking git...", Progress{Phase: PhaseInstall, Message: "Unpacking git"}, true},
		{"I: Configuring libc-bin...", Progress{Phase: PhaseConfigure, Message: "Configuring libc-bin"}, true},
		{"W: Failure trying to run: chroot", Progress{Phase: PhaseInstall, Message: "debootstrap warning: Failure trying to run: chroot"}, true},
		{"dpkg: warning: something", Progress{}, false},
		{"", Progress{}, false},
	} {
		got, ok := parseDebootstrapLine(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseDebootstrapLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/t\04`: `/t\04`} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
