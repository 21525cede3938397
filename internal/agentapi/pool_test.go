package agentapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
)

// TestChannelConnCap: a sandbox that authenticates more than MaxConns
// connections gets the extras closed; the first MaxConns stay usable.
func TestChannelConnCap(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for len(conns) < agentapi.MaxConns+8 && time.Now().Before(deadline) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		if err := agentapi.AgentHandshake(c, "sb1", key); err != nil {
			c.Close() // the handshake rate cap: wait for a token
			time.Sleep(60 * time.Millisecond)
			continue
		}
		conns = append(conns, c)
	}
	if len(conns) < agentapi.MaxConns+8 {
		t.Fatalf("only %d handshakes in 30s", len(conns))
	}
	open, closed := 0, 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			var b [1]byte
			_, err := c.Read(b[:])
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				open++
			case errors.Is(err, io.EOF):
				closed++
			default:
				t.Errorf("read: %v", err)
			}
		}()
	}
	wg.Wait()
	if open != agentapi.MaxConns || closed != 8 {
		t.Fatalf("%d connections kept, %d closed; want %d and 8", open, closed, agentapi.MaxConns)
	}
	for _, c := range conns {
		c.Close()
	}
	if err := ch.WaitDisconnected(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestChannelPoolStreams: concurrent streams each hold a connection of
// their own while short requests still pass; quiescing closes every
// connection, a hijacked one included, and the agent stops dialing.
func TestChannelPoolStreams(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	var up *agentapi.Uplink
	var upMu sync.Mutex
	hijacked := make(chan struct{})
	up = serveAgent(t, path, "sb1", key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/exec":
			io.WriteString(w, `{"type":"start","pid":1}`+"\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/processes/1/attach":
			c, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n" + `{"type":"start","pid":1}` + "\n")
			bw.Flush()
			close(hijacked)
			var b [1]byte
			_, _ = c.Read(b[:]) // held until the uplink closes it
			c.Close()
		case "/quiesce":
			w.WriteHeader(http.StatusNoContent)
			_ = http.NewResponseController(w).Flush()
			upMu.Lock()
			u := up
			upMu.Unlock()
			go u.Close()
		default:
			io.WriteString(w, `{"ok":true}`)
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := ch.Client()
	var streams []*agentapi.Stream
	for i := 0; i < 10; i++ {
		s, err := c.Exec(ctx, agentapi.ExecRequest{Shell: "x"}, 0)
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		if ev, err := s.Next(); err != nil || ev.Type != "start" {
			t.Fatalf("exec %d: first event %+v, %v", i, ev, err)
		}
		streams = append(streams, s)
	}
	if h, err := c.Health(ctx); err != nil || !h.OK {
		t.Fatalf("health beside 10 streams: %+v, %v", h, err)
	}
	att, err := c.Attach(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-hijacked
	if ev, err := att.Next(); err != nil || ev.Type != "start" {
		t.Fatalf("attach: %+v, %v", ev, err)
	}
	if err := ch.Quiesce(ctx, 5*time.Second); err != nil {
		t.Fatalf("quiesce with 10 streams and a hijacked connection open: %v", err)
	}
	for i, s := range streams {
		if _, err := s.Next(); err == nil {
			t.Fatalf("stream %d still delivers after quiesce", i)
		}
		s.Close()
	}
	if _, err := att.Next(); err == nil {
		t.Fatal("hijacked stream still delivers after quiesce")
	}
	att.Close()
	hctx, hcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer hcancel()
	if _, err := c.Health(hctx); !unavailable(err) {
		t.Fatalf("health after quiesce = %v, want unavailable (the agent stopped dialing)", err)
	}
}

// TestForgetDropsConnections: forgetting a fork's parent identity closes
// the connections authenticated with it, without the agent's help.
func TestForgetDropsConnections(t *testing.T) {
	path, key, parentKey := socketPath(t), newKey(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	forget := ch.Allow("parent", parentKey)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ok":true}`) })
	// A raw connection that authenticated as the parent and never closes on its own.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := agentapi.AgentHandshake(conn, "parent", parentKey); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = agentapi.ServeConn(conn, ok) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if h, err := ch.Client().Health(ctx); err != nil || !h.OK {
		t.Fatalf("health through the parent identity: %+v, %v", h, err)
	}
	forget()
	if err := ch.WaitDisconnected(ctx, 5*time.Second); err != nil {
		t.Fatalf("after forget: %v", err)
	}
	<-done
}

// TestConnectionReuse: one authenticated connection carries request after
// request (exec streams to their exit, control answers): the daemon
// neither closes it nor waits for another spare.
func TestConnectionReuse(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := agentapi.AgentHandshake(conn, "sb1", key); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = agentapi.ServeConn(conn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/exec":
				io.WriteString(w, `{"type":"start","pid":1}`+"\n")
				w.(http.Flusher).Flush()
				io.WriteString(w, `{"type":"exit","exit_code":0}`+"\n")
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond) // the answer's end comes after the exit event
			case "/fs/list":
				io.WriteString(w, "[]\n")
			default:
				io.WriteString(w, `{"ok":true}`+"\n")
			}
		}))
	}()
	c := ch.Client()
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.Exec(ctx, agentapi.ExecRequest{Shell: "true"}, 0)
		if err != nil {
			cancel()
			t.Fatalf("exec %d on the one connection: %v", i, err)
		}
		for {
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("exec %d: %v", i, err)
			}
			_ = ev
		}
		s.Close()
		if _, err := c.Health(ctx); err != nil {
			t.Fatalf("health %d on the one connection: %v", i, err)
		}
		if _, err := c.List(ctx, agentapi.ListRequest{}); err != nil {
			t.Fatalf("list %d on the one connection: %v", i, err)
		}
		cancel()
	}
	ch.Close()
	<-done
}

// authCounter counts the channel's "authenticated" log lines: one per
// connection the agent dialed and the daemon accepted.
type authCounter struct {
	mu sync.Mutex
	n  int
}

func (a *authCounter) Write(p []byte) (int, error) {
	a.mu.Lock()
	a.n += bytes.Count(p, []byte("agent channel authenticated"))
	a.mu.Unlock()
	return len(p), nil
}

func (a *authCounter) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// TestIdleConnectionsAreKept: neither a spare waiting for its first request
// nor a kept-alive connection between requests is closed by the agent's
// server on a clock. net/http's default (ReadHeaderTimeout, 10 s, also the
// idle timeout) closed both, and every agent redialled and re-authenticated
// them each 10 s: the reaper's round at the same interval found none alive.
func TestIdleConnectionsAreKept(t *testing.T) {
	t.Parallel()
	path, key := socketPath(t), newKey(t)
	var auths authCounter
	ch, err := agentapi.Listen(path, "sb1", key, slog.New(slog.NewTextHandler(&auths, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	serveAgent(t, path, "sb1", key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ok":true}`+"\n")
	}))
	health := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := ch.Client().Health(ctx); err != nil {
			t.Fatal(err)
		}
	}
	health() // takes a spare, which stays kept alive; the agent dials a replacement
	want := agentapi.Spares + 1
	for deadline := time.Now().Add(5 * time.Second); auths.count() < want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := auths.count(); n != want {
		t.Fatalf("%d connections authenticated after one request, want %d", n, want)
	}
	time.Sleep(11 * time.Second) // past net/http's 10 s header and idle timeouts
	health()
	time.Sleep(200 * time.Millisecond) // a replacement, had one been needed, is dialed at once
	if n := auths.count(); n != want {
		t.Errorf("%d connections authenticated after 11 s idle and a second request, want still %d: idle connections were closed and redialled", n, want)
	}
}
