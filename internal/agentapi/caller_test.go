package agentapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// acceptOver runs DaemonAccept on d accepting (kind, id) with key.
func acceptOver(d net.Conn, kind agentapi.Kind, id string, key []byte) chan error {
	done := make(chan error, 1)
	go func() {
		_, got, err := agentapi.DaemonAccept(d, func(k agentapi.Kind, x string) ([]byte, bool) {
			return key, k == kind && x == id
		})
		if err == nil && got != kind {
			err = fmt.Errorf("accepted as %v, want %v", got, kind)
		}
		d.Close()
		done <- err
	}()
	return done
}

// TestCallerHandshakeKinds: an uplink and a caller can never be taken for
// each other, even holding the right key: the magic differs, and so do the
// labels of both proofs.
func TestCallerHandshakeKinds(t *testing.T) {
	k := newKey(t)
	for _, tc := range []struct {
		name       string
		dial       func(net.Conn, string, []byte) error
		accept     agentapi.Kind
		wantAccept bool
	}{
		{"caller as caller", agentapi.CallerHandshake, agentapi.KindCaller, true},
		{"agent as agent", agentapi.AgentHandshake, agentapi.KindAgent, true},
		{"caller where only agents are accepted", agentapi.CallerHandshake, agentapi.KindAgent, false},
		{"agent where only callers are accepted", agentapi.AgentHandshake, agentapi.KindCaller, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, d := net.Pipe()
			done := acceptOver(d, tc.accept, "sb1", k)
			aerr := tc.dial(a, "sb1", k)
			a.Close()
			derr := <-done
			if tc.wantAccept != (aerr == nil && derr == nil) {
				t.Fatalf("dialer %v, daemon %v; want accepted=%v", aerr, derr, tc.wantAccept)
			}
		})
	}
	t.Run("DaemonHandshake refuses a caller", func(t *testing.T) {
		a, d := net.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := agentapi.DaemonHandshake(d, func(string) ([]byte, bool) { return k, true })
			d.Close()
			done <- err
		}()
		aerr := agentapi.CallerHandshake(a, "sb1", k)
		a.Close()
		if derr := <-done; aerr == nil || !errs.Is(derr, errs.Unauthenticated) {
			t.Fatalf("caller %v, daemon %v; want refused", aerr, derr)
		}
	})
}

// TestCallerProofNotReplayable: a daemon proof recorded on an uplink is no
// caller's proof for the same nonces (a man in the middle cannot turn one
// kind into the other).
func TestCallerProofNotReplayable(t *testing.T) {
	k := newKey(t)
	// A fake daemon that answers a caller's hello with the uplink labels'
	// proof: the caller must refuse it.
	a, d := net.Pipe()
	go func() {
		defer d.Close()
		head := make([]byte, 9)
		if _, err := io.ReadFull(d, head); err != nil {
			return
		}
		rest := make([]byte, int(head[8])+32)
		if _, err := io.ReadFull(d, rest); err != nil {
			return
		}
		// Relay to a real daemon as an uplink hello with the same nonce.
		up, real := net.Pipe()
		defer up.Close()
		go func() {
			_, _ = agentapi.DaemonHandshake(real, func(string) ([]byte, bool) { return k, true })
			real.Close()
		}()
		hello := append([]byte("berthch1"), head[8])
		hello = append(hello, rest...)
		if _, err := up.Write(hello); err != nil {
			return
		}
		resp := make([]byte, 64)
		if _, err := io.ReadFull(up, resp); err != nil {
			return
		}
		_, _ = d.Write(resp)
		_, _ = io.Copy(io.Discard, d)
	}()
	err := agentapi.CallerHandshake(a, "sb1", k)
	a.Close()
	if !errs.Is(err, errs.Unauthenticated) {
		t.Fatalf("caller accepted an uplink's daemon proof: %v", err)
	}
}

// FuzzDaemonAccept: whatever a sandbox sends on a fresh connection, the
// daemon authenticates nothing without the key's proof, and reads at most
// a bounded hello.
func FuzzDaemonAccept(f *testing.F) {
	f.Add([]byte("berthcl1\x03sb1" + strings.Repeat("n", 32) + strings.Repeat("p", 32)))
	f.Add([]byte("berthch1\x03sb1" + strings.Repeat("n", 32)))
	f.Add([]byte("berthcl1\xff"))
	f.Add([]byte("berthcl1\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})
	key := bytes.Repeat([]byte{7}, agentapi.KeySize)
	f.Fuzz(func(t *testing.T, in []byte) {
		a, d := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, a) }()
		go func() {
			_, _ = a.Write(in)
			a.Close() // the daemon reads EOF instead of waiting out its deadline
		}()
		id, _, err := agentapi.DaemonAccept(d, func(agentapi.Kind, string) ([]byte, bool) { return key, true })
		d.Close()
		a.Close()
		if err == nil {
			t.Fatalf("authenticated %q from %q without the key", id, in)
		}
	})
}

// callerChannel is a channel for sandbox "sb1" whose callers are served
// by h, and an agent-side Caller dialing it as ident (nil: as sb1).
func callerChannel(t *testing.T, h http.Handler, ident agentapi.Identity) (*agentapi.Channel, *agentapi.Caller, []byte, string) {
	t.Helper()
	k := newKey(t)
	path := filepath.Join(t.TempDir(), agentapi.SocketName)
	ch, err := agentapi.Listen(path, "sb1", k, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	ln := &pushListener{ch: make(chan net.Conn, 16), done: make(chan struct{})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	ch.ServeCallers(func(c net.Conn) { ln.ch <- c })
	if ident == nil {
		ident = func() (string, []byte) { return "sb1", k }
	}
	caller := agentapi.NewCaller(path, ident)
	t.Cleanup(func() {
		caller.Quiesce()
		ch.Close()
		srv.Close()
		<-served
	})
	return ch, caller, k, path
}

type pushListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *pushListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pushListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pushListener) Addr() net.Addr { return &net.UnixAddr{Name: "test", Net: "unix"} }

func get(t *testing.T, c *agentapi.Caller, path string) (int, string, error) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://x"+path, nil)
	resp, err := c.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestCallerRoundTrip(t *testing.T) {
	var n atomic.Int64
	ch, c, _, _ := callerChannel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	}), nil)
	for i := range 50 {
		code, body, err := get(t, c, "/v1/sandboxes/self")
		if err != nil || code != 200 || body != "GET /v1/sandboxes/self" {
			t.Fatalf("request %d: %d %q %v", i, code, body, err)
		}
	}
	if got := ch.Callers(); got != 1 {
		t.Fatalf("sequential requests used %d caller connections, want 1 (kept alive)", got)
	}
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _, err := get(t, c, "/x"); err != nil || code != 200 {
				t.Errorf("concurrent request: %d %v", code, err)
			}
		}()
	}
	wg.Wait()
	if got := ch.Callers(); got > agentapi.MaxCallers {
		t.Fatalf("%d caller connections, bound %d", got, agentapi.MaxCallers)
	}
}

// TestCallerBound: a sandbox dialing callers itself gets at most
// MaxCallers of them; the next handshake is refused.
func TestCallerBound(t *testing.T) {
	block := make(chan struct{})
	ch, _, k, path := callerChannel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }), nil)
	defer close(block)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range agentapi.MaxCallers + 2 {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		err = agentapi.CallerHandshake(conn, "sb1", k)
		if i < agentapi.MaxCallers && err != nil {
			t.Fatalf("caller %d refused: %v", i, err)
		}
		if i >= agentapi.MaxCallers && err == nil {
			t.Fatalf("caller %d accepted beyond the bound %d", i, agentapi.MaxCallers)
		}
	}
	// The slots are taken at the handshake (that is the bound, checked
	// above); a caller is put on the books just after its handshake's
	// answer, so the count may lag the last answer a moment.
	deadline := time.Now().Add(5 * time.Second)
	for ch.Callers() != agentapi.MaxCallers && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := ch.Callers(); got != agentapi.MaxCallers {
		t.Fatalf("%d callers on the books, want %d", got, agentapi.MaxCallers)
	}
}

// TestCallerQuiesce: quiesce cuts a request in flight, leaves no caller
// connection to the host (what a gVisor checkpoint needs), holds new
// requests until Reopen, and then they go through.
func TestCallerQuiesce(t *testing.T) {
	started := make(chan struct{}, 1)
	ch, c, _, _ := callerChannel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	}), nil)
	if code, _, err := get(t, c, "/fast"); err != nil || code != 200 {
		t.Fatalf("warm-up: %d %v", code, err)
	}
	slow := make(chan error, 1)
	go func() { _, _, err := get(t, c, "/slow"); slow <- err }()
	<-started
	c.Quiesce()
	if err := <-slow; err == nil {
		t.Fatal("a request in flight survived a quiesce")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ch.WaitDisconnected(ctx, 5*time.Second); err != nil {
		t.Fatalf("caller connections left after quiesce: %v (agent side %d)", err, c.Conns())
	}
	waited := make(chan error, 1)
	go func() {
		code, body, err := get(t, c, "/after")
		if err == nil && (code != 200 || body != "ok") {
			err = fmt.Errorf("%d %q", code, body)
		}
		waited <- err
	}()
	select {
	case err := <-waited:
		t.Fatalf("a request went through while quiesced: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if c.Conns() != 0 {
		t.Fatal("a quiesced caller dialed")
	}
	c.Reopen()
	if err := <-waited; err != nil {
		t.Fatalf("request after reopen: %v", err)
	}
}

// TestCallerForkIdentity: a fork child's channel accepts its parent's
// identity for the uplink until rekeyed, never for a caller: what a
// caller reaches is the channel's own sandbox only.
func TestCallerForkIdentity(t *testing.T) {
	parentKey := newKey(t)
	ch, c, _, _ := callerChannel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		func() (string, []byte) { return "parent", parentKey })
	forget := ch.Allow("parent", parentKey)
	defer forget()
	_, _, err := get(t, c, "/v1/sandboxes/self")
	if !errs.Is(err, errs.Unavailable) {
		t.Fatalf("a caller with the parent's identity got through the child's channel: %v", err)
	}
}
