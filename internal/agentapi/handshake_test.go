package agentapi_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// recorder keeps what one side of a net.Pipe wrote.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.out.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *recorder) written() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte{}, r.out.Bytes()...)
}

type result struct {
	id  string
	err error
}

// handshake runs both sides over a pipe: agent (id, agentKey) against a
// daemon accepting id with daemonKey. It returns both errors and what the
// agent wrote.
func handshake(t *testing.T, id string, agentKey, daemonKey []byte) (agentErr, daemonErr error, agentBytes []byte) {
	t.Helper()
	a, d := net.Pipe()
	ra := &recorder{Conn: a}
	done := make(chan result, 1)
	go func() {
		got, err := agentapi.DaemonHandshake(d, func(x string) ([]byte, bool) { return daemonKey, x == id })
		d.Close()
		done <- result{got, err}
	}()
	agentErr = agentapi.AgentHandshake(ra, id, agentKey)
	a.Close()
	r := <-done
	if r.err == nil && r.id != id {
		t.Fatalf("daemon authenticated %q, want %q", r.id, id)
	}
	return agentErr, r.err, ra.written()
}

func TestHandshake(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	t.Run("same key", func(t *testing.T) {
		aerr, derr, _ := handshake(t, "sb1", k1, k1)
		if aerr != nil || derr != nil {
			t.Fatalf("agent %v, daemon %v", aerr, derr)
		}
	})
	t.Run("agent holds the wrong key", func(t *testing.T) {
		// The agent sees the daemon's proof fail first and refuses to answer:
		// the daemon never gets an agent proof.
		aerr, derr, _ := handshake(t, "sb1", k2, k1)
		if !errs.Is(aerr, errs.Unauthenticated) || derr == nil {
			t.Fatalf("agent %v, daemon %v; want both refused", aerr, derr)
		}
	})
	t.Run("fake daemon without the key", func(t *testing.T) {
		aerr, _, wrote := handshake(t, "sb1", k1, k2)
		if !errs.Is(aerr, errs.Unauthenticated) || !strings.Contains(aerr.Error(), "not this sandbox's daemon") {
			t.Fatalf("agent %v; want it to refuse the daemon", aerr)
		}
		if want := 8 + 1 + 3 + 32; len(wrote) != want {
			t.Fatalf("agent wrote %d bytes to a daemon it could not verify; want only its %d-byte hello", len(wrote), want)
		}
	})
	t.Run("id not accepted", func(t *testing.T) {
		a, d := net.Pipe()
		go func() { _ = agentapi.AgentHandshake(a, "other", k1); a.Close() }()
		_, err := agentapi.DaemonHandshake(d, func(x string) ([]byte, bool) { return k1, x == "sb1" })
		d.Close()
		if !errs.Is(err, errs.Unauthenticated) {
			t.Fatalf("daemon %v, want unauthenticated", err)
		}
	})
	t.Run("derived keys differ per sandbox", func(t *testing.T) {
		m := newKey(t)
		if bytes.Equal(agentapi.DeriveKey(m, "a"), agentapi.DeriveKey(m, "b")) ||
			!bytes.Equal(agentapi.DeriveKey(m, "a"), agentapi.DeriveKey(m, "a")) {
			t.Fatal("DeriveKey is not a per-id function")
		}
	})
}

// TestHandshakeReplay: an agent's recorded hello and proof do not
// authenticate a second session (the daemon's nonce is fresh), and a
// recorded daemon answer does not fool a second agent.
func TestHandshakeReplay(t *testing.T) {
	key := newKey(t)
	aerr, derr, wrote := handshake(t, "sb1", key, key)
	if aerr != nil || derr != nil {
		t.Fatalf("first session: %v %v", aerr, derr)
	}
	t.Run("agent frames replayed to the daemon", func(t *testing.T) {
		a, d := net.Pipe()
		go func() {
			_, _ = a.Write(wrote[:8+1+3+32]) // hello
			_, _ = io.ReadFull(a, make([]byte, 64))
			_, _ = a.Write(wrote[8+1+3+32:]) // the old proof
			a.Close()
		}()
		_, err := agentapi.DaemonHandshake(d, func(string) ([]byte, bool) { return key, true })
		d.Close()
		if !errs.Is(err, errs.Unauthenticated) {
			t.Fatalf("replayed agent proof: daemon %v, want unauthenticated", err)
		}
	})
	t.Run("daemon answer replayed to an agent", func(t *testing.T) {
		// Record a daemon's answer to one hello, then play it to a new agent.
		a, d := net.Pipe()
		rd := &recorder{Conn: d}
		go func() { _ = agentapi.AgentHandshake(a, "sb1", key); a.Close() }()
		_, _ = agentapi.DaemonHandshake(rd, func(string) ([]byte, bool) { return key, true })
		d.Close()
		answer := rd.written()[:64]
		a2, d2 := net.Pipe()
		go func() {
			_, _ = io.ReadFull(d2, make([]byte, 8+1+3+32))
			_, _ = d2.Write(answer)
			_, _ = io.Copy(io.Discard, d2)
		}()
		err := agentapi.AgentHandshake(a2, "sb1", key)
		a2.Close()
		d2.Close()
		if !errs.Is(err, errs.Unauthenticated) {
			t.Fatalf("replayed daemon proof: agent %v, want unauthenticated", err)
		}
	})
}

// TestHandshakeBadFrames: malformed and oversized hellos are refused
// before anything is allocated for them.
func TestHandshakeBadFrames(t *testing.T) {
	key := newKey(t)
	hello := func(magic string, n byte, id string) []byte {
		b := append([]byte(magic), n)
		b = append(b, id...)
		return append(b, make([]byte, 32)...)
	}
	tests := []struct {
		name  string
		frame []byte
	}{
		{"bad magic", hello("GET / HT", 3, "sb1")},
		{"empty id", hello("berthch1", 0, "")},
		{"id too long", hello("berthch1", 255, strings.Repeat("a", 255))},
		{"truncated", hello("berthch1", 3, "sb1")[:20]},
		{"http request", []byte("GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, d := net.Pipe()
			go func() { _, _ = a.Write(tt.frame); a.Close() }()
			start := time.Now()
			_, err := agentapi.DaemonHandshake(d, func(string) ([]byte, bool) { return key, true })
			d.Close()
			if err == nil {
				t.Fatal("daemon accepted a malformed hello")
			}
			if time.Since(start) > 2*time.Second {
				t.Fatalf("refusal took %s", time.Since(start))
			}
		})
	}
	t.Run("agent refuses bad parameters", func(t *testing.T) {
		a, _ := net.Pipe()
		defer a.Close()
		if err := agentapi.AgentHandshake(a, strings.Repeat("x", 65), key); err == nil {
			t.Fatal("65-byte id accepted")
		}
		if err := agentapi.AgentHandshake(a, "sb1", key[:8]); err == nil {
			t.Fatal("short key accepted")
		}
	})
}

// TestChannelRefusesWrongAgent: an agent with another sandbox's key never
// becomes the channel's session; the right one does, and a fork's parent
// identity is accepted only while allowed.
func TestChannelRefusesWrongAgent(t *testing.T) {
	path, key, other := socketPath(t), newKey(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ok":true}`) })
	imposter := agentapi.DialUplink(path, fixed("sb1", other), ok, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := ch.Client().Health(ctx)
	cancel()
	imposter.Close()
	if !unavailable(err) {
		t.Fatalf("Health through an imposter = %v, want unavailable (no session)", err)
	}
	parentKey := newKey(t)
	parent := agentapi.DialUplink(path, fixed("parent", parentKey), ok, nil)
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = ch.Client().Health(ctx)
	cancel()
	if !unavailable(err) {
		t.Fatal("a parent identity was accepted without Allow")
	}
	forget := ch.Allow("parent", parentKey)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	h, err := ch.Client().Health(ctx)
	cancel()
	if err != nil || !h.OK {
		t.Fatalf("Health through the allowed parent identity = %+v, %v", h, err)
	}
	forget()
	parent.Close()
	if err := ch.WaitDisconnected(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	parent = agentapi.DialUplink(path, fixed("parent", parentKey), ok, nil)
	defer parent.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = ch.Client().Health(ctx)
	cancel()
	if !unavailable(err) {
		t.Fatal("the parent identity was still accepted after forget")
	}
}

// hugeJSON streams n bytes of one never-ending JSON string.
type hugeJSON struct{ n, sent int64 }

func (h *hugeJSON) Read(p []byte) (int, error) {
	if h.sent >= h.n {
		return 0, io.EOF
	}
	if h.sent == 0 {
		p[0] = '"'
		h.sent++
		return 1, nil
	}
	m := int64(len(p))
	if m > h.n-h.sent {
		m = h.n - h.sent
	}
	for i := range p[:m] {
		p[i] = 'a'
	}
	h.sent += m
	return int(m), nil
}

// TestBoundedAnswers: an authenticated agent that answers with 1 GiB of
// JSON (a control answer, a stream event) gets an error, quickly, not the
// daemon's memory.
func TestBoundedAnswers(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	serveAgent(t, path, "sb1", key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/exec":
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data":`)
		case "/big-header":
			w.Header().Set("X-Junk", strings.Repeat("a", 1<<20))
		}
		_, _ = io.Copy(w, &hugeJSON{n: 1 << 30})
	}))
	c := ch.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := c.Health(ctx); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("1 GiB health answer: %v, want resource_exhausted", err)
	}
	if _, err := c.List(ctx, agentapi.ListRequest{}); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("1 GiB list answer: %v, want resource_exhausted", err)
	}
	s, err := c.Exec(ctx, agentapi.ExecRequest{Shell: "x"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(); err != nil || ev.Type != "start" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	if _, err := s.Next(); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("1 GiB event: %v, want resource_exhausted", err)
	}
	s.Close()
	if time.Since(start) > 20*time.Second {
		t.Fatalf("bounded reads took %s: something read far past the limit", time.Since(start))
	}
	// The channel still serves after all that.
	if _, err := c.Health(ctx); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("health after: %v", err)
	}
}
