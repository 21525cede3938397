// Package e2e holds black-box tests that build the real binaries, start a
// real `berth serve` on 127.0.0.1 with a temporary data dir, and drive it
// through the CLI and the REST API, with real runc, overlayfs and SQLite.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/testutil"
)

// server is one running `berth serve`.
type server struct {
	t       *testing.T
	bin     string
	dataDir string
	url     string
	key     string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	extra   []string
	netArgs []string // this server's own bridge, table and subnet (network_test.go)
}

var tinyOnce struct {
	sync.Once
	path string
	err  error
}

// tinyTar builds the busybox "tiny" template tarball once per test process.
func tinyTar(t *testing.T) string {
	tinyOnce.Do(func() {
		dir, err := testutil.ProcessDir("berth-tiny-")
		if err != nil {
			tinyOnce.err = err
			return
		}
		root := filepath.Join(dir, "rootfs")
		if err := rootfs.BusyboxRootFS(root); err != nil {
			tinyOnce.err = err
			return
		}
		tinyOnce.path = filepath.Join(dir, "tiny.tar")
		if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", tinyOnce.path, ".").CombinedOutput(); err != nil {
			tinyOnce.err = fmt.Errorf("tar: %v: %s", err, out)
		}
	})
	if tinyOnce.err != nil {
		t.Fatalf("tiny template: %v", tinyOnce.err)
	}
	return tinyOnce.path
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startServer starts berth serve with the tiny template imported. The data
// dir is short on purpose: agent socket paths must fit in 107 bytes.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	testutil.RequireRoot(t)
	return startServerFrom(t, testutil.BuildBinaries(t), extra...)
}

// startServerFrom is startServer with the binaries in bin.
func startServerFrom(t *testing.T, bin string, extra ...string) *server {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	dataDir, err := os.MkdirTemp("", "be")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, bin: bin, dataDir: dataDir, extra: extra, netArgs: testNetwork(t)}
	s.start()
	t.Cleanup(func() { s.cleanup() })
	if out, code := s.run("template", "import", "tiny", tinyTar(t)); code != 0 {
		t.Fatalf("template import: %s", out)
	}
	return s
}

func (s *server) start() {
	s.t.Helper()
	addr := freePort(s.t)
	s.url = "http://" + addr
	s.log = &bytes.Buffer{}
	args := append([]string{"serve", "--data-dir", s.dataDir, "--listen", addr, "--no-default-template"}, s.netArgs...)
	args = append(args, s.extra...)
	s.cmd = exec.Command(filepath.Join(s.bin, "berth"), args...)
	lw := &lockedWriter{w: s.log} // one lock for both streams: they share the buffer
	s.cmd.Stdout, s.cmd.Stderr = lw, lw
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(s.url + "/v1/health"); err == nil {
			resp.Body.Close()
			b, err := os.ReadFile(filepath.Join(s.dataDir, "admin.key"))
			if err == nil {
				s.key = strings.TrimSpace(string(b))
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("berth serve did not come up:\n%s", s.logs())
}

func (s *server) logs() string {
	lw := s.cmd.Stdout.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return s.log.String()
}

// kill9 kills the daemon without any chance to clean up.
func (s *server) kill9() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = s.cmd.Process.Wait()
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = s.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		s.kill9()
	}
}

// cleanup removes every sandbox through the API, stops the daemon and then
// checks that nothing of berth is left on the host.
func (s *server) cleanup() {
	if s.cmd.ProcessState == nil {
		out, _ := s.run("ls", "--json")
		var list []struct{ ID string }
		_ = json.Unmarshal([]byte(out), &list)
		for _, sb := range list {
			s.run("rm", "-f", sb.ID)
		}
		s.stop()
	}
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", s.logs())
	}
	assertNoLeftovers(s.t, s.dataDir, false)
	// runsc keeps one bind mount (null-netns) in its state root for the
	// daemon's lifetime; it is not a sandbox's, so it goes with the data dir.
	unmountUnder(filepath.Join(s.dataDir, "runtime"))
	_ = os.RemoveAll(s.dataDir)
}

// assertNoLeftovers fails if mounts, containers or sandbox dirs remain.
// With the daemon still running (daemonUp), its channel tmpfs (DATA/chan,
// one for every sandbox) stays mounted, but no sandbox's dir may be left
// on it; after a stop that leaves no sandbox it is gone too.
func assertNoLeftovers(t *testing.T, dataDir string, daemonUp bool) {
	t.Helper()
	shared := filepath.Join(dataDir, "chan")
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); daemonUp && len(f) > 4 && f[4] == shared {
			continue
		}
		if strings.Contains(line, dataDir+"/") && !strings.Contains(line, dataDir+"/runtime/runsc/") {
			t.Errorf("mount left behind: %s", line)
		}
	}
	chans, _ := os.ReadDir(shared)
	for _, e := range chans {
		t.Errorf("channel dir left behind: %s", e.Name())
	}
	out, _ := exec.Command("runc", "--root", filepath.Join(dataDir, "runtime", "runc"), "list", "-q").Output()
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("runc containers left behind: %s", s)
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, e := range entries {
		t.Errorf("sandbox dir left behind: %s", e.Name())
	}
}

func unmountUnder(dir string) {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
		}
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (s *server) env(key string) []string {
	return append(os.Environ(), "BERTH_URL="+s.url, "BERTH_API_KEY="+key)
}

// run runs the CLI as the admin and returns combined output and exit code.
func (s *server) run(args ...string) (string, int) {
	return s.runAs(s.key, nil, args...)
}

func (s *server) runAs(key string, stdin io.Reader, args ...string) (string, int) {
	stdout, stderr, code := s.runSplit(key, stdin, args...)
	return stdout + stderr, code
}

func (s *server) runSplit(key string, stdin io.Reader, args ...string) (string, string, int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "berth"), args...)
	cmd.Env = s.env(key)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("berth %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// must runs the CLI and fails the test on a non-zero exit.
func (s *server) must(args ...string) string {
	s.t.Helper()
	out, code := s.run(args...)
	if code != 0 {
		s.t.Fatalf("berth %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return strings.TrimSpace(out)
}

// api calls the REST API directly.
func (s *server) api(key, method, path string, body any) (int, map[string]any) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func (s *server) create(args ...string) string {
	s.t.Helper()
	return s.must(append([]string{"create", "--template", "tiny"}, args...)...)
}
