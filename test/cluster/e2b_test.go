package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"
)

// e2bThroughReplica drives E2B's wire protocol through a replica: the
// control plane creates a sandbox (placed and bound like a REST create),
// envd's REST /files writes and reads a file in it (routed by the
// E2b-Sandbox-Id header, authenticated on the node by the sandbox's access
// token), the control plane kills it.
func e2bThroughReplica(t *testing.T, c *cluster, replica *proc, key string) {
	hc := &http.Client{Timeout: 2 * time.Minute}
	do := func(method, path string, body io.Reader, hdr map[string]string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, replica.url+path, body)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, b
	}
	st, body := do("POST", "/sandboxes", strings.NewReader(`{"templateID":"tiny","timeout":300,"metadata":{"via":"e2b"}}`),
		map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
	if st != http.StatusCreated && st != http.StatusOK {
		t.Fatalf("E2B create through %s: %d %s", replica.name, st, body)
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
		EnvdVersion     string `json:"envdVersion"`
	}
	if err := json.Unmarshal(body, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("E2B create answer %s: %v", body, err)
	}
	obj, err := c.sandboxObj(sb.SandboxID)
	if err != nil {
		t.Fatalf("E2B sandbox %s has no object: %v", sb.SandboxID, err)
	}
	if obj.Spec.NodeName == "" || !localIDs(t, c.node(obj.Spec.NodeName))[sb.SandboxID] {
		t.Errorf("E2B sandbox %s bound to %q, not running there", sb.SandboxID, obj.Spec.NodeName)
	}
	envd := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}

	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	part, _ := mw.CreateFormFile("file", "/tmp/e2b.txt")
	fmt.Fprint(part, "written through "+replica.name)
	mw.Close()
	hdr := map[string]string{"Content-Type": mw.FormDataContentType()}
	for k, v := range envd {
		hdr[k] = v
	}
	if st, body := do("POST", "/files?path=/tmp/e2b.txt", &form, hdr); st != http.StatusOK {
		t.Errorf("envd POST /files through %s: %d %s", replica.name, st, body)
	}
	if st, body := do("GET", "/files?path=/tmp/e2b.txt", nil, envd); st != http.StatusOK || string(body) != "written through "+replica.name {
		t.Errorf("envd GET /files through %s: %d %q", replica.name, st, body)
	}
	// Without the sandbox's token the node refuses envd traffic.
	noTok := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}
	if st, _ := do("GET", "/files?path=/tmp/e2b.txt", nil, noTok); st != http.StatusUnauthorized {
		t.Errorf("envd without X-Access-Token: %d, want 401", st)
	}
	if st, body := do("GET", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": key}); st != http.StatusOK {
		t.Errorf("E2B GET /sandboxes/%s: %d %s", sb.SandboxID, st, body)
	}
	if st, body := do("DELETE", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": key}); st != http.StatusNoContent && st != http.StatusOK {
		t.Errorf("E2B DELETE /sandboxes/%s: %d %s", sb.SandboxID, st, body)
	}
}
