package rootfs

import (
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// BusyboxPath is where Debian's busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// busyboxFiles are the text files of the tiny rootfs.
var busyboxFiles = map[string]string{
	"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":    "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n",
	"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	"etc/hostname": "sandbox\n",
	"etc/profile":  "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
}

// busyboxDirs are the directories of the tiny rootfs with their modes and owners.
var busyboxDirs = []struct {
	path     string
	mode     os.FileMode
	uid, gid int
}{
	{"bin", 0o755, 0, 0}, {"sbin", 0o755, 0, 0}, {"usr/bin", 0o755, 0, 0}, {"usr/sbin", 0o755, 0, 0},
	{"etc", 0o755, 0, 0}, {"root", 0o700, 0, 0}, {"home", 0o755, 0, 0}, {"home/user", 0o755, 1000, 1000},
	{"tmp", 0o777 | os.ModeSticky, 0, 0}, {"proc", 0o555, 0, 0}, {"sys", 0o555, 0, 0}, {"dev", 0o755, 0, 0},
	{"run", 0o755, 0, 0}, {"var/tmp", 0o777 | os.ModeSticky, 0, 0},
}

// BusyboxRootFS builds a tiny root filesystem in dir: a static busybox with
// a symlink per applet (including /bin/sh), root and user (1000,
// /home/user), and a sticky /tmp. Tests use it, and it is the "tiny" template.
func BusyboxRootFS(dir string) error {
	if err := checkStatic(BusyboxPath); err != nil {
		return err
	}
	for _, d := range busyboxDirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return errs.Wrap(errs.Internal, err, "create %s", p)
		}
		// MkdirAll honours the umask; set the exact mode and owner.
		if err := os.Chmod(p, d.mode); err != nil {
			return errs.Wrap(errs.Internal, err, "chmod %s", p)
		}
		if err := os.Lchown(p, d.uid, d.gid); err != nil {
			return errs.Wrap(errs.PermissionDenied, err, "chown %s", p)
		}
	}
	for name, content := range busyboxFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return errs.Wrap(errs.Internal, err, "write %s", name)
		}
	}
	if err := copyFile(BusyboxPath, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.Command(BusyboxPath, "--list-full").Output()
	if err != nil {
		return errs.Wrap(errs.Internal, err, "busybox --list-full")
	}
	for _, applet := range strings.Fields(string(out)) {
		link := filepath.Join(dir, applet)
		if filepath.Clean(applet) == "bin/busybox" {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return errs.Wrap(errs.Internal, err, "create %s", filepath.Dir(link))
		}
		if err := os.Symlink("/bin/busybox", link); err != nil && !errors.Is(err, os.ErrExist) {
			return errs.Wrap(errs.Internal, err, "link applet %s", applet)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "bin/sh")); err != nil {
		return errs.Wrap(errs.Internal, err, "busybox has no sh applet")
	}
	return nil
}

// checkStatic fails unless path is a statically linked ELF: a dynamic
// busybox would need a loader and libc inside the rootfs.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errs.E(errs.Unavailable, "%s not found: install busybox-static", path)
		}
		return errs.Wrap(errs.Internal, err, "read %s", path)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errs.E(errs.FailedPrecondition, "%s is dynamically linked: install busybox-static", path)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open %s", src)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", dst)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "copy %s to %s", src, dst)
	}
	return nil
}
