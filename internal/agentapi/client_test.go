package agentapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
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

func socketPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "berth-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "agent.sock")
}

// serveUnix runs h on a unix socket until the test ends.
func serveUnix(t *testing.T, path string, h http.Handler) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
}

// TestErrorKindsDecode checks every errs.Kind survives the wire: the agent's
// {"code","message"} body becomes an *errs.Error of the same kind.
func TestErrorKindsDecode(t *testing.T) {
	path := socketPath(t)
	serveUnix(t, path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := r.URL.Query().Get("path")
		if code == "garbage" {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "not json")
			return
		}
		w.WriteHeader(http.StatusTeapot)
		_ = json.NewEncoder(w).Encode(agentapi.Error{Code: code, Message: "msg for " + code})
	}))
	c := agentapi.NewClient(path)
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
	stale := socketPath(t)
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the socket file stays, nobody listens: connection refused
	tests := []struct{ name, path string }{
		{"missing socket", filepath.Join(filepath.Dir(stale), "nothing.sock")},
		{"refused", stale},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := agentapi.NewClient(tt.path).Health(context.Background())
			if !errs.Is(err, errs.Unavailable) {
				t.Fatalf("err = %v (kind %v), want unavailable", err, errs.KindOf(err))
			}
		})
	}
}

// TestWaitReady polls a socket that appears later, served by the real agent.
func TestWaitReady(t *testing.T) {
	path := socketPath(t)
	c := agentapi.NewClient(path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := c.WaitReady(ctx, 10*time.Millisecond)
	cancel()
	if !errs.Is(err, errs.Unavailable) {
		t.Fatalf("WaitReady without agent = %v, want unavailable", err)
	}
	a := agent.New(agent.Config{SocketPath: path, EnvFile: path + ".env", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
