package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/rootfs"
)

// SelfServer is a `berth serve` the bench started on a fresh data dir.
type SelfServer struct {
	URL, Key, DataDir, LogPath string
	// Upstream is the effects-https row's TLS test service (when asked
	// for), or UpstreamErr why it could not be started.
	Upstream    *HTTPSUpstream
	UpstreamErr error
	args        []string // the serve command line, for Restart
	cmd         *exec.Cmd
	done        chan struct{}
}

// StartSelf starts `berthBin serve` on a new data dir under /tmp with a
// short name (agent socket paths must stay under 108 bytes), without the
// default template, and imports the busybox "tiny" template. With
// upstream, it first starts the TLS test service of the effects-https
// row and has the server resolve and trust it; a failure there only makes
// that row not available.
func StartSelf(ctx context.Context, berthBin string, upstream bool) (*SelfServer, error) {
	dataDir, err := os.MkdirTemp("/tmp", "b")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &SelfServer{URL: "http://" + addr, DataDir: dataDir, LogPath: dataDir + ".log", done: make(chan struct{})}
	s.args = []string{berthBin, "serve", "--data-dir", dataDir, "--listen", addr, "--no-default-template"}
	if upstream {
		if s.Upstream, s.UpstreamErr = StartHTTPSUpstream(20 * time.Millisecond); s.UpstreamErr == nil {
			s.args = append(s.args, "--egress-hosts", s.Upstream.HostsFile, "--upstream-ca", s.Upstream.CAFile)
		}
	}
	if err := s.spawn(); err != nil {
		return nil, err
	}
	fail := func(err error) (*SelfServer, error) {
		s.Stop()
		b, _ := os.ReadFile(s.LogPath)
		return nil, fmt.Errorf("%w\nserver log:\n%s", err, tailString(string(b), 2000))
	}
	if err := waitHealthy(ctx, s.URL, 60*time.Second); err != nil {
		return fail(err)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	if err != nil {
		return fail(err)
	}
	s.Key = strings.TrimSpace(string(b))
	if err := s.importTiny(ctx); err != nil {
		return fail(err)
	}
	return s, nil
}

// spawn starts the server process on s.args, its output appended to the log.
func (s *SelfServer) spawn() error {
	logf, err := os.OpenFile(s.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// Not tied to ctx: the server is stopped explicitly (SIGTERM, then wait).
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// PID is the running server process's.
func (s *SelfServer) PID() int { return s.cmd.Process.Pid }

// Restart stops the server with SIGTERM (sandboxes keep running: they live
// on the host, not in the daemon) and starts it again on the same data dir
// and address. stopped is how long the old process took to exit; Restart
// returns once the new one answers /v1/health; spawned is when it was started.
func (s *SelfServer) Restart(ctx context.Context) (stopped time.Duration, spawned time.Time, err error) {
	start := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return time.Since(start), time.Time{}, fmt.Errorf("the server did not exit within 60 s of SIGTERM (killed)")
	}
	stopped = time.Since(start)
	spawned = time.Now()
	if err := s.spawn(); err != nil {
		return stopped, spawned, err
	}
	return stopped, spawned, waitHealthy(ctx, s.URL, 120*time.Second)
}

// importTiny builds the busybox rootfs (as the e2e tests do) and imports it as "tiny".
func (s *SelfServer) importTiny(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "berth-bench-tiny-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		return err
	}
	tar := filepath.Join(dir, "tiny.tar")
	if out, err := exec.CommandContext(ctx, "tar", "-C", root, "--numeric-owner", "-cf", tar, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %v: %s", err, out)
	}
	return ImportTemplate(ctx, NewClient(s.URL, s.Key), "tiny", tar)
}

// ImportTemplate uploads a rootfs tarball as template name.
func ImportTemplate(ctx context.Context, c *Client, name, tarPath string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := c.ImportTemplate(ctx, name, f, "import "+filepath.Base(tarPath)); err != nil {
		return fmt.Errorf("import template %s: %w", name, err)
	}
	return nil
}

// TemplateReady reports whether the server has template name, ready.
func TemplateReady(ctx context.Context, c *Client, name string) bool {
	t, err := c.Template(ctx, name)
	if err != nil {
		return false
	}
	return t.State == "ready"
}

// Stop deletes every sandbox, stops the server (SIGTERM, SIGKILL after 20 s)
// and removes its data dir unless something is still mounted under it.
func (s *SelfServer) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errList []error
	if s.Key != "" {
		c := NewClient(s.URL, s.Key)
		if all, err := c.ListAll(ctx, client.ListOptions{}); err == nil {
			for _, sb := range all {
				if err := c.Delete(ctx, sb.ID); err != nil {
					errList = append(errList, err)
				}
			}
		}
	}
	// A delete answers before its teardown ends: let the server finish
	// them (a stopping server drains them for 20 s only; Reconcile would
	// finish the rest at a next start this data dir never has).
	for ctx.Err() == nil {
		if es, err := os.ReadDir(filepath.Join(s.DataDir, "sandboxes")); err != nil || len(es) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	detachRuntimeNetns(s.DataDir)
	if s.Upstream != nil {
		s.Upstream.Close()
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), s.DataDir+"/") {
		return errors.Join(append(errList, fmt.Errorf("mounts remain under %s; left in place", s.DataDir))...)
	}
	if err := os.RemoveAll(s.DataDir); err != nil {
		errList = append(errList, err)
	}
	if len(errList) == 0 {
		os.Remove(s.LogPath)
	}
	return errors.Join(errList...)
}

// detachRuntimeNetns unmounts the namespace files runsc keeps under its
// state root (runtime/runsc/null-netns) for as long as its user lives: once
// the daemon has stopped nothing needs them, and they pin the data dir.
func detachRuntimeNetns(dataDir string) { detachNetns(filepath.Join(dataDir, "runtime")) }

// detachNetns lazily unmounts every nsfs mount below dir.
func detachNetns(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasPrefix(f[4], filepath.Clean(dir)+"/") {
			continue
		}
		if _, fstype, ok := strings.Cut(line, " - "); ok && strings.HasPrefix(fstype, "nsfs ") {
			_ = unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
}
