package template

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// debootstrap runs debootstrap into rootfs, turning its "I:" lines into
// progress steps.
func debootstrap(ctx context.Context, r defaultRecipe, rootfs, debs string, progress func(Progress)) error {
	bin, err := lookTool("debootstrap")
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errs.E(errs.PermissionDenied, "debootstrap needs root")
	}
	// Downloaded .debs are kept beside the tars, so a recipe change
	// rebuilds without downloading everything again.
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "create deb cache")
	}
	args := []string{"--variant=" + r.Variant, "--include=" + strings.Join(r.Include, ","),
		"--components=main", "--cache-dir=" + debs, r.Suite, rootfs, r.Mirror}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PATH="+hostPath(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// debootstrap forks dpkg, wget and chroot'ed scripts: cancel the group.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	progress(Progress{Phase: PhaseDownload, Message: fmt.Sprintf("debootstrap %s (%s) from %s", r.Suite, r.Variant, r.Mirror)})
	tail, err := runLines(cmd, func(line string) {
		if p, ok := parseDebootstrapLine(line); ok {
			progress(p)
		}
	})
	if err != nil {
		if ctx.Err() != nil {
			return errs.Wrap(errs.Unavailable, ctx.Err(), "debootstrap cancelled")
		}
		return errs.Wrap(errs.Unavailable, err, "debootstrap failed; last output:\n%s", tail)
	}
	progress(Progress{Phase: PhaseInstall, Message: fmt.Sprintf("debootstrap done in %s", time.Since(start).Round(time.Second))})
	return nil
}

// parseDebootstrapLine maps "I: Retrieving libc6 2.36-9" to a progress step.
func parseDebootstrapLine(line string) (Progress, bool) {
	level, msg, ok := strings.Cut(strings.TrimSpace(line), ": ")
	if !ok {
		return Progress{}, false
	}
	switch level {
	case "I":
	case "W", "E":
		return Progress{Phase: PhaseInstall, Message: "debootstrap " + map[string]string{"W": "warning", "E": "error"}[level] + ": " + msg}, true
	default:
		return Progress{}, false
	}
	verb, _, _ := strings.Cut(msg, " ")
	phase := PhaseInstall
	switch verb {
	case "Retrieving", "Validating", "Checking", "Resolving", "Found", "Keyring":
		phase = PhaseDownload
	case "Extracting":
		phase = PhaseExtract
	case "Installing", "Unpacking":
		phase = PhaseInstall
	case "Configuring", "Base":
		phase = PhaseConfigure
	}
	return Progress{Phase: phase, Message: strings.TrimSuffix(msg, "...")}, true
}

// runLines runs cmd with stdout and stderr merged, calling each for every
// line, and returns the last lines for error messages.
func runLines(cmd *exec.Cmd, each func(string)) (string, error) {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			tail = append(tail, line)
			if len(tail) > 30 {
				tail = tail[1:]
			}
			each(line)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	return strings.Join(tail, "\n"), err
}

// chrootScript runs a shell script inside rootfs as root.
func chrootScript(ctx context.Context, rootfs, script string) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Path = "/bin/sh" // resolved inside the chroot
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errs.Wrap(errs.Internal, err, "configure rootfs: %s", strings.TrimSpace(string(out)))
	}
	return nil
}
