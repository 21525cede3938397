package agentapi_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func socketPath(t testing.TB) string {
	dir, err := os.MkdirTemp("", "berth-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "agent.sock")
}

func newKey(t *testing.T) []byte {
	k := make([]byte, agentapi.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// unavailable: no agent answered (the channel says so, or the caller's deadline passed waiting).
func unavailable(err error) bool {
	return errs.Is(err, errs.Unavailable) || errors.Is(err, context.DeadlineExceeded)
}

func fixed(id string, key []byte) agentapi.Identity {
	return func() (string, []byte) { return id, key }
}

// listen opens the host end of a channel for id until the test ends.
func listen(t *testing.T, path, id string, key []byte) *agentapi.Channel {
	ch, err := agentapi.Listen(path, id, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// serveAgent dials the channel at path and serves h (an agent's end) until the test ends.
func serveAgent(t *testing.T, path, id string, key []byte, h http.Handler) *agentapi.Uplink {
	up := agentapi.DialUplink(path, fixed(id, key), h, nil)
	t.Cleanup(up.Close)
	return up
}

// TestErrorKindsDecode checks every errs.Kind survives the wire: the agent's
// {"code","message"} body becomes an *errs.Error of the same kind.
func TestErrorKindsDecode(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	serveAgent(t, path, "sb1", key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := r.URL.Query().Get("path")
		if code == "garbage" {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "not json")
			return
		}
		w.WriteHeader(http.StatusTeapot)
		_ = json.NewEncoder(w).Encode(agentapi.Error{Code: code, Message: "msg for " + code})
	}))
	c := ch.Client()
	ctx := context.Background()
	for _, k := range errs.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			_, _, err := c.ReadFile(ctx, k.String(), "")
			var e *errs.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %#v, want *errs.Error", err)
			}
			if d := cmp.Diff(&errs.Error{Kind: k, Message: "msg for " + k.String()}, e); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
	t.Run("unknown code", func(t *testing.T) {
		_, _, err := c.ReadFile(ctx, "made_up", "")
		if errs.KindOf(err) != errs.Internal {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("non-JSON body", func(t *testing.T) {
		_, _, err := c.ReadFile(ctx, "garbage", "")
		if errs.KindOf(err) != errs.Internal || err == nil {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestUnreachableIsUnavailable(t *testing.T) {
	path := socketPath(t)
	ch := listen(t, path, "sb1", newKey(t))
	t.Run("no agent", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := ch.Client().Health(ctx); !unavailable(err) {
			t.Fatalf("err = %v (kind %v), want unavailable", err, errs.KindOf(err))
		}
	})
	t.Run("closed channel", func(t *testing.T) {
		ch.Close()
		if _, err := ch.Client().Health(context.Background()); !errs.Is(err, errs.Unavailable) {
			t.Fatalf("err = %v (kind %v), want unavailable", err, errs.KindOf(err))
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("socket left behind after Close: %v", err)
		}
	})
}

// TestWaitReady waits for an agent that connects later: the real agent.
func TestWaitReady(t *testing.T) {
	path, key := socketPath(t), newKey(t)
	ch := listen(t, path, "sb1", key)
	c := ch.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := c.WaitReady(ctx, 10*time.Millisecond)
	cancel()
	if !errs.Is(err, errs.Unavailable) {
		t.Fatalf("WaitReady without agent = %v, want unavailable", err)
	}
	a := agent.New(agent.Config{SocketPath: path, EnvFile: path + ".env", SandboxID: "sb1", Key: key,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer a.Close()
	go func() {
		time.Sleep(50 * time.Millisecond)
		if err := a.Listen(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := c.WaitReady(ctx, 20*time.Millisecond)
	if err != nil || !h.OK || h.Version != agent.Version {
		t.Fatalf("WaitReady = %+v, %v", h, err)
	}
}
