package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestFullDiskErrorKeepsItsKind fills a small workspace disk from inside the
// sandbox (as root, with dd) and then uploads a file through the REST API:
// the agent's ENOSPC travels through the agent client, the daemon and the
// server, each adding context, and must still answer ResourceExhausted (429,
// reason resource_exhausted), not a 500. On runc and runsc.
func TestFullDiskErrorKeepsItsKind(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	defer s.stopRunsc()
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt, "--disk", "16")
			defer s.run("rm", "-f", id)
			// dd stops at ENOSPC with a non-zero exit; what matters is the disk is full.
			out, _ := s.run("exec", "--user", "root", id, "--", "sh", "-c",
				"dd if=/dev/zero of=/home/user/fill bs=1M count=64 2>&1; sync; df -k /home/user | tail -1")
			t.Logf("fill: %s", strings.TrimSpace(out))

			q := url.Values{"path": {"/home/user/upload"}}
			req, _ := http.NewRequest(http.MethodPut, s.url+"/v1/sandboxes/"+id+"/files?"+q.Encode(),
				bytes.NewReader(bytes.Repeat([]byte("x"), 4<<20)))
			req.Header.Set("X-API-Key", s.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
				Reason  string `json:"reason"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("upload to a full disk: HTTP %d, body %q", resp.StatusCode, b)
			}
			if resp.StatusCode != http.StatusTooManyRequests || body.Code != resp.StatusCode || body.Reason != "resource_exhausted" {
				t.Fatalf("upload to a full disk: HTTP %d %+v, want 429 resource_exhausted", resp.StatusCode, body)
			}
			if !strings.Contains(body.Message, "no space left") {
				t.Errorf("message %q does not say the disk is full", body.Message)
			}
			// The sandbox is intact: freeing space makes uploads work again.
			s.must("exec", "--user", "root", id, "--", "rm", "-f", "/home/user/fill")
			if st, _ := s.apiRaw(http.MethodPut, "/v1/sandboxes/"+id+"/files?"+q.Encode(), []byte("ok")); st != http.StatusOK {
				t.Fatalf("upload after freeing space: HTTP %d", st)
			}
		})
	}
}

// apiRaw sends a raw body as the admin and returns the status and body.
func (s *server) apiRaw(method, path string, body []byte) (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, bytes.NewReader(body))
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}
