package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// client is the CLI's only way to the server: the public REST API.
type client struct {
	base string
	key  string
	hc   *http.Client
}

const defaultDataDir = "/var/lib/berth"

func newClient() (*client, error) {
	base := os.Getenv("BERTH_URL")
	if base == "" {
		base = "http://127.0.0.1:7070"
	}
	key := os.Getenv("BERTH_API_KEY")
	if key == "" {
		dir := os.Getenv("BERTH_DATA_DIR")
		if dir == "" {
			dir = defaultDataDir
		}
		b, err := os.ReadFile(filepath.Join(dir, "admin.key"))
		if err != nil {
			return nil, errs.E(errs.Unauthenticated, "no API key: set BERTH_API_KEY (or run as root next to a local server, which reads %s/admin.key)", dir)
		}
		key = strings.TrimSpace(string(b))
	}
	return &client{base: strings.TrimRight(base, "/"), key: key, hc: &http.Client{}}, nil
}

// apiError is the server's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
	Reason  string `json:"reason"`
}

var reasonKinds = func() map[string]errs.Kind {
	m := map[string]errs.Kind{}
	for _, k := range errs.Kinds() {
		m[k.String()] = k
	}
	return m
}()

func (c *client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "cannot reach berth at %s (is `berth serve` running?)", c.base)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var ae apiError
		if json.Unmarshal(b, &ae) != nil || ae.Message == "" {
			return nil, errs.E(errs.Internal, "%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
		}
		k, ok := reasonKinds[ae.Reason]
		if !ok {
			k = errs.Internal
		}
		return nil, &errs.Error{Kind: k, Field: ae.Field, Message: ae.Message}
	}
	return resp, nil
}

// call sends JSON (in may be nil) and decodes JSON into out (may be nil).
func (c *client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, q, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

func sbPath(id string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
