package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// DefaultCacheDir is where built template tars are kept across runs
// (setup, CI and tests share it).
const DefaultCacheDir = "/var/cache/berth/rootfs"

// defaultRecipe is everything that decides the default template's content;
// its hash names the cached tar, so changing any field rebuilds it. The
// mirror is not part of it: it says where the suite's packages come from,
// not what they are (every mirror serves the same signed release), so a
// host that moves to another mirror or proxy keeps its cached template.
type defaultRecipe struct {
	Version   int      `json:"version"`
	Suite     string   `json:"suite"`
	Mirror    string   `json:"-"` // the host's (ResolveDebianMirror), filled in at build time
	Variant   string   `json:"variant"`
	Include   []string `json:"include"`
	Configure string   `json:"configure"`
}

// configureScript runs inside the debootstrapped rootfs (chroot).
const configureScript = `set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
getent group 1000 >/dev/null || groupadd --gid 1000 user
id -u user >/dev/null 2>&1 || useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash --comment "" user
install -d -o 1000 -g 1000 -m 0755 /home/user
printf 'user ALL=(ALL:ALL) NOPASSWD:ALL\n' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo -c -q -f /etc/sudoers.d/user
# debootstrap copied the building host's hostname, hosts and resolv.conf
# (with the host's modes); the runtime provides real ones per sandbox.
rm -f /etc/hostname /etc/hosts /etc/resolv.conf
printf 'localhost\n' > /etc/hostname
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts
: > /etc/resolv.conf
chmod 0644 /etc/hostname /etc/hosts /etc/resolv.conf
# Like Debian's slim images: no docs, man pages or translations, now or
# for packages installed later in the sandbox (saves ~80 MB of 300).
cat > /etc/dpkg/dpkg.cfg.d/berth-slim <<'EOS'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOS
chmod 0644 /etc/dpkg/dpkg.cfg.d/berth-slim
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/lintian/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
rm -f /etc/machine-id /var/lib/dbus/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
find /var/log -type f -exec truncate -s 0 {} +
rm -rf /tmp/* /var/tmp/* /root/.bash_history
`

var theDefaultRecipe = defaultRecipe{
	Version: 2,
	Suite:   "bookworm",
	Variant: "minbase",
	// sudo for the user; less/xz/unzip/procps/iproute2 are what agents reach for first.
	Include:   []string{"bash", "ca-certificates", "coreutils", "curl", "git", "iproute2", "less", "procps", "python3", "sudo", "unzip", "xz-utils"},
	Configure: configureScript,
}

func recipeHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are hashed
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// DefaultTarName is the cached tar's file name for the current recipe.
func DefaultTarName() string { return "default-" + recipeHash(theDefaultRecipe) + ".tar" }

// BuildDefault builds (or reuses) the default template: Debian bookworm
// minbase made by debootstrap from the host's Debian mirror (its apt
// sources, or BERTH_DEBIAN_MIRROR; see ResolveDebianMirror) with bash, python3, git,
// curl, sudo and a few tools, a user "user" (uid/gid 1000, home /home/user,
// shell /bin/bash, passwordless sudo), neutral /etc/hostname, no apt caches
// and no docs, man pages or translations. The result is a tar at
// cacheDir/default-<recipe hash>.tar plus a ".sha256" file holding the tar's
// digest (= its layer digest); when the tar exists it is returned without
// building, and after a build tars of older recipes are removed. Downloaded
// packages are kept in cacheDir/debs. Concurrent builders (other processes
// too) wait for one another. Needs root and debootstrap.
func BuildDefault(ctx context.Context, cacheDir string, progress func(Progress)) (string, error) {
	return BuildDefaultFrom(ctx, cacheDir, "", progress)
}

// BuildDefaultFrom is BuildDefault with the Debian mirror given ("" = the
// host's). The mirror is looked up only when the tar must be built.
func BuildDefaultFrom(ctx context.Context, cacheDir, mirror string, progress func(Progress)) (string, error) {
	r := theDefaultRecipe
	tarPath, err := buildCached(ctx, cacheDir, DefaultTarName(), progress, packOptions{}, func(ctx context.Context, rootfs string, progress func(Progress)) error {
		m, err := ResolveDebianMirror(mirror, "/etc/apt", r.Suite)
		if err != nil {
			return err
		}
		r.Mirror = m
		if err := debootstrap(ctx, r, rootfs, filepath.Join(cacheDir, "debs"), progress); err != nil {
			return err
		}
		progress(Progress{Phase: PhaseConfigure, Message: "configuring user, sudo and hostname; cleaning apt caches"})
		return chrootScript(ctx, rootfs, r.Configure)
	})
	if err == nil {
		pruneOld(cacheDir, "default-", DefaultTarName())
	}
	return tarPath, err
}

// pruneOld removes tars of earlier recipes (prefix*.tar and their digest
// and lock files), keeping keep. Best effort: a leftover only costs disk.
func pruneOld(cacheDir, prefix, keep string) {
	old, _ := filepath.Glob(filepath.Join(cacheDir, prefix+"*.tar*"))
	for _, p := range old {
		base := filepath.Base(p)
		if base == keep || strings.HasPrefix(base, keep+".") || strings.HasSuffix(base, ".build") {
			continue
		}
		_ = os.Remove(p)
	}
}

// buildCached runs build into a scratch rootfs and packs it to
// cacheDir/name, unless that tar already exists.
func buildCached(ctx context.Context, cacheDir, name string, progress func(Progress), popt packOptions,
	build func(ctx context.Context, rootfs string, progress func(Progress)) error) (string, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	if cacheDir == "" {
		return "", errs.Field("cache_dir", "must not be empty")
	}
	tarPath := filepath.Join(cacheDir, name)
	if fileExists(tarPath) {
		progress(Progress{Phase: PhaseCached, Message: "using cached " + tarPath})
		return tarPath, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create cache dir")
	}
	unlock, err := lockFile(ctx, tarPath+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if fileExists(tarPath) { // built by whoever held the lock
		progress(Progress{Phase: PhaseCached, Message: "using cached " + tarPath})
		return tarPath, nil
	}
	work := tarPath + ".build"
	if err := removeBuildDir(work); err != nil {
		return "", err
	}
	defer func() {
		if err := removeBuildDir(work); err != nil {
			progress(Progress{Phase: PhasePack, Message: "warning: " + err.Error()})
		}
	}()
	rootfs := filepath.Join(work, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create build dir")
	}
	if err := build(ctx, rootfs, progress); err != nil {
		return "", err
	}
	progress(Progress{Phase: PhasePack, Message: "packing rootfs to " + tarPath})
	if err := writeTarFile(ctx, rootfs, tarPath, popt, progress); err != nil {
		return "", err
	}
	fi, _ := os.Stat(tarPath)
	progress(Progress{Phase: PhasePack, Message: fmt.Sprintf("packed %s (%d MiB)", tarPath, fi.Size()>>20), Bytes: fi.Size()})
	return tarPath, nil
}

// writeTarFile packs rootfs to tarPath atomically and writes tarPath.sha256.
func writeTarFile(ctx context.Context, rootfs, tarPath string, popt packOptions, progress func(Progress)) error {
	tmp := tarPath + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "create tar")
	}
	defer os.Remove(tmp)
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	popt.tick = func(n int64) {
		if n%16384 == 0 {
			progress(Progress{Phase: PhasePack, Message: fmt.Sprintf("packed %d entries", n)})
		}
	}
	err = packTar(ctx, bw, rootfs, popt)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write %s", tarPath)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if err := os.WriteFile(tarPath+".sha256", []byte(digest+"\n"), 0o644); err != nil {
		return errs.Wrap(errs.Internal, err, "write digest")
	}
	if err := os.Rename(tmp, tarPath); err != nil {
		return errs.Wrap(errs.Internal, err, "move tar into place")
	}
	return nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// lockFile takes an exclusive flock, polling so that ctx can cancel the wait.
func lockFile(ctx context.Context, p string) (func(), error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "open build lock")
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, errs.Wrap(errs.Internal, err, "lock %s", p)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, errs.Wrap(errs.Unavailable, ctx.Err(), "waiting for build lock %s", p)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// removeBuildDir unmounts anything a failed debootstrap left mounted below
// dir (proc, sys) before deleting it, so RemoveAll never walks into a host
// filesystem.
func removeBuildDir(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read mounts")
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return errs.Wrap(errs.Internal, err, "unmount %s", m)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return errs.Wrap(errs.Internal, err, "remove %s", dir)
	}
	return nil
}

// mountsUnder lists mount points below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	prefix := filepath.Clean(dir) + "/"
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		if strings.HasPrefix(mp, prefix) {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for j := 1; j <= 3; j++ {
				c := s[i+j]
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hostPath makes sure sbin directories are searched: debootstrap, chroot's
// tools and mkfs live there and a non-login root shell may lack them.
func hostPath() string {
	p := os.Getenv("PATH")
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin", "/bin"} {
		if !strings.Contains(":"+p+":", ":"+d+":") {
			p += ":" + d
		}
	}
	return strings.TrimPrefix(p, ":")
}

func lookTool(name string) (string, error) {
	for _, d := range filepath.SplitList(hostPath()) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errs.E(errs.FailedPrecondition, "%s not found in PATH (run scripts/setup.sh)", name)
}
