//go:build linux && !clientonly

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/testutil"
)

// berth serve --cluster, as the binary runs it: flags → kubeconfig →
// store, token, admin key → a replica answering on --listen, stopping with
// its context.
func TestServeCluster(t *testing.T) {
	srv, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip("no API server:", err)
	}
	defer srv.Stop()
	ns := srv.Namespace(t)
	kc := srv.Kubeconfig(t, "", ns)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	var (
		addr string
		done chan error
		key  string
	)
	// A port found free can be taken before serve binds it (the other test
	// packages start API servers and etcds on free ports too): on that
	// error alone, start again on another.
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = l.Addr().String()
		l.Close()
		done = make(chan error, 1)
		go func() {
			done <- runServe(ctx, []string{"--cluster", "--kubeconfig", kc, "--namespace", ns, "--listen", addr,
				"--data-dir", dir, "--log-level", "warn"}, io.Discard)
		}()
		var early error
		testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
			select {
			case early = <-done:
				return nil
			default:
			}
			b, err := os.ReadFile(filepath.Join(dir, "admin.key"))
			if err != nil {
				return err
			}
			key = strings.TrimSpace(string(b))
			resp, err := http.Get("http://" + addr + "/v1/health")
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		})
		if early == nil {
			break
		}
		if attempt >= 2 || !strings.Contains(early.Error(), "address already in use") {
			t.Fatalf("serve --cluster ended early: %v", early)
		}
		t.Logf("serve --cluster: %v; again on another port", early)
	}
	get := func(path, key string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+addr+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The API server may still say "storage is (re)initializing" for a moment.
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		if st, body := get("/v1/sandboxes", key); st != 200 || !strings.Contains(body, `"sandboxes": []`) {
			return fmt.Errorf("list: %d %s", st, body)
		}
		return nil
	})
	if st, _ := get("/v1/sandboxes", "e2b_nope"); st != 401 {
		t.Fatalf("a bad key: %d", st)
	}
	// Pools are WarmPool objects on a replica (none yet); that
	// collection's storage may still be initializing too.
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		if st, body := get("/v1/pools", key); st != 200 || strings.TrimSpace(body) != "[]" {
			return fmt.Errorf("pools: %d %s", st, body)
		}
		return nil
	})
	if st, body := get("/v1/info", key); st != 200 || !strings.Contains(body, `"admin": true`) {
		t.Fatalf("info: %d %s", st, body)
	}
	// The token Secret exists for the nodes to read.
	var sec struct {
		Data map[string][]byte `json:"data"`
	}
	if err := srv.Client.Do(t.Context(), "GET", "/api/v1/namespaces/"+ns+"/secrets/berth-cluster", nil, nil, &sec); err != nil || len(sec.Data["token"]) < 32 {
		t.Fatalf("berth-cluster secret: %v %v", err, sec.Data)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve --cluster: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve --cluster did not stop with its context")
	}
}
