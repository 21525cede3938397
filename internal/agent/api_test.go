package agent

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/testutil"
)

// apiFixture is an agent-side in-sandbox API server forwarding to a real
// channel whose callers are answered by h.
func apiFixture(t *testing.T, h http.Handler) (*apiServer, string) {
	t.Helper()
	testutil.RequireRoot(t) // the socket directory is made root-owned
	dir := t.TempDir()
	key := make([]byte, agentapi.KeySize)
	_, _ = rand.Read(key)
	ch, err := agentapi.Listen(filepath.Join(dir, agentapi.SocketName), "sb1", key, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	conns := make(chan net.Conn, 16)
	ln := &chanListener{ch: conns, done: make(chan struct{})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	ch.ServeCallers(func(c net.Conn) { conns <- c })
	caller := agentapi.NewCaller(filepath.Join(dir, agentapi.SocketName), func() (string, []byte) { return "sb1", key })
	sock := filepath.Join(dir, "run", "berth-agent", "api.sock")
	s := newAPIServer(sock, caller, func(string, ...any) {})
	s.start()
	t.Cleanup(func() {
		s.close()
		ch.Close()
		srv.Close()
		<-served
	})
	return s, sock
}

type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}
func (l *chanListener) Addr() net.Addr { return &net.UnixAddr{Name: "t", Net: "unix"} }

func callSock(sock, method, path string, body io.Reader) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest(method, "http://berth"+path, body)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestAPISocket: the agent's socket forwards requests (bounded), and comes
// back after its root deletes it, replaces its directory with a link, or
// takes the directory over — without touching what a link points at.
func TestAPISocket(t *testing.T) {
	s, sock := apiFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Write([]byte(r.Method + " " + r.URL.Path + " " + strings.Repeat("b", int(min(n, 1)))))
	}))
	ok := func(when string) {
		t.Helper()
		code, body, err := callSock(sock, "GET", "/v1/sandboxes/self", nil)
		if err != nil || code != 200 || body != "GET /v1/sandboxes/self " {
			t.Fatalf("%s: %d %q %v", when, code, body, err)
		}
	}
	ok("at start")
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o666 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
	// Refused before it is read: a 400, or the connection closed under the writer.
	if code, _, err := callSock(sock, "POST", "/x", strings.NewReader(strings.Repeat("x", agentapi.MaxCallerRequest+1))); code != 400 && (err == nil || !strings.Contains(err.Error(), "broken pipe") && !strings.Contains(err.Error(), "reset")) {
		t.Fatalf("an oversized body: %d %v; want 400 or a closed connection", code, err)
	}

	os.Remove(sock)
	if err := s.ensure(); err != nil {
		t.Fatal(err)
	}
	ok("after the socket was deleted")

	dir := filepath.Dir(sock)
	target := t.TempDir()
	os.RemoveAll(dir)
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
	if err := s.ensure(); err != nil {
		t.Fatal(err)
	}
	ok("after the directory became a link")
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("api dir is %v %v, want a directory", fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Fatalf("the agent wrote through the planted link: %v", entries)
	}

	os.RemoveAll(dir)
	os.Mkdir(dir, 0o777)
	os.Chmod(dir, 0o777)
	os.WriteFile(sock, []byte("not a socket"), 0o644)
	if err := s.ensure(); err != nil {
		t.Fatal(err)
	}
	ok("after the directory was taken over")
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o755 {
		t.Fatalf("api dir mode %v, want 0755", fi.Mode().Perm())
	}

	// Quiesced: a request waits; reopened: it goes through.
	s.caller.Quiesce()
	done := make(chan error, 1)
	go func() {
		code, _, err := callSock(sock, "GET", "/v1/sandboxes/self", nil)
		if err == nil && code != 200 {
			err = io.ErrUnexpectedEOF
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("answered while quiesced: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	s.caller.Reopen()
	if err := <-done; err != nil {
		t.Fatalf("after reopen: %v", err)
	}
}
