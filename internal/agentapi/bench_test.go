package agentapi_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/berth-dev/berth/internal/agentapi"
)

// BenchmarkChannel measures the channel alone (no sandbox): a small
// request's round trip and a 64 MiB upload and download, each next to the
// same over a plain unix socket HTTP server (what the agent served before).
func BenchmarkChannel(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 64<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut:
			_, _ = io.Copy(io.Discard, r.Body)
			io.WriteString(w, `{"path":"/x"}`)
		case http.MethodGet:
			if r.URL.Path == "/files" {
				_, _ = w.Write(payload)
				return
			}
			io.WriteString(w, `{"ok":true}`)
		}
	})
	path, key := socketPath(b), make([]byte, agentapi.KeySize)
	ch, err := agentapi.Listen(path, "sb1", key, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	up := agentapi.DialUplink(path, fixed("sb1", key), h, nil)
	defer up.Close()
	plainPath := socketPath(b)
	ln, err := net.Listen("unix", plainPath)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	defer srv.Close()
	plain := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", plainPath)
	}}}
	ctx := context.Background()
	c := ch.Client()
	if _, err := c.WaitReady(ctx, 0); err != nil {
		b.Fatal(err)
	}
	b.Run("rtt/channel", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Health(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rtt/plain", func(b *testing.B) {
		for b.Loop() {
			resp, err := plain.Get("http://agent/health")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	b.Run("upload64M/channel", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := c.WriteFile(ctx, "/x", "", 0, bytes.NewReader(payload)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("upload64M/plain", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPut, "http://agent/files", bytes.NewReader(payload))
			resp, err := plain.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	b.Run("download64M/channel", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			r, _, err := c.ReadFile(ctx, "/x", "")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, r)
			r.Close()
		}
	})
	b.Run("download64M/plain", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			resp, err := plain.Get("http://agent/files")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
