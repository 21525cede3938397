package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/api/gen/filesystem"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestEnvdFilesystem(t *testing.T) {
	e := newEnvdEnv(t)
	ctx := context.Background()
	root := filepath.Join(e.dir, "fs")

	mk, err := e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: root + "/a/b"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := mk.Msg.GetEntry(); got.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || got.GetPath() != root+"/a/b" || got.GetName() != "b" {
		t.Errorf("makeDir entry = %v", got)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: root + "/a/b"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("second makeDir: %v, want already_exists", err)
	}
	if err := os.WriteFile(root+"/a/f.txt", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: root + "/a/f.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := st.Msg.GetEntry(); en.GetSize() != 5 || en.GetType() != filesystem.FileType_FILE_TYPE_FILE || en.GetMode() != 0o644 ||
		en.GetPermissions() != "-rw-r--r--" || en.GetOwner() != "root" || en.GetModifiedTime().AsTime().IsZero() {
		t.Errorf("stat entry = %v", en)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: root + "/nope"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat missing: %v, want not_found", err)
	}
	for depth, want := range map[uint32][]string{1: {"b", "f.txt"}, 2: {"b", "f.txt"}, 0: {"b", "f.txt"}} {
		ls, err := e.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: root + "/a", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, en := range ls.Msg.GetEntries() {
			names = append(names, en.GetName())
		}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("depth %d (-want +got):\n%s", depth, diff)
		}
	}
	mv, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: root + "/a/f.txt", Destination: root + "/c/g.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetPath() != root+"/c/g.txt" {
		t.Errorf("move entry = %v", mv.Msg.GetEntry())
	}
	if _, err := e.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: root + "/nope", Destination: root + "/x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("move missing: %v, want not_found", err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: root + "/a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: root + "/a"})); err != nil {
		t.Errorf("remove missing: %v, want ok", err)
	}

	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		w, err := e.fs.WatchDir(wctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: root + "/c"}))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if !w.Receive() || w.Msg().GetStart() == nil {
			t.Fatalf("first watch event %v err %v", w.Msg(), w.Err())
		}
		if err := os.WriteFile(root+"/c/new.txt", []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		created := false
		for w.Receive() {
			if ev := w.Msg().GetFilesystem(); ev != nil && ev.GetName() == "new.txt" && ev.GetType() == filesystem.EventType_EVENT_TYPE_CREATE {
				created = true
				break
			}
		}
		if !created {
			t.Fatalf("no create event: %v", w.Err())
		}
		for w.Receive() {
		}
		if connect.CodeOf(w.Err()) != connect.CodeDeadlineExceeded {
			t.Errorf("watch end: %v, want deadline_exceeded", w.Err())
		}
		miss, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: root + "/missing"}))
		if err != nil {
			t.Fatal(err)
		}
		defer miss.Close()
		if miss.Receive() || connect.CodeOf(miss.Err()) != connect.CodeNotFound {
			t.Errorf("watching a missing dir: %v, want not_found", miss.Err())
		}
	})
}

// request issues a raw envd REST request with the SDK's headers.
func (e *envdEnv) request(method, target string, body io.Reader, header http.Header) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+target, body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", "sbxe2btest1")
	req.Header.Set("X-Access-Token", testToken)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, b
}

func TestEnvdFilesREST(t *testing.T) {
	e := newEnvdEnv(t)
	root := filepath.Join(e.dir, "up")

	// Multipart with raw filenames that carry directories (relative ones
	// resolve against root's home), as files.write([...]) sends them.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, data := range map[string]string{root + "/x/a.txt": "A", root + "/y/z/b.txt": "BB"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		h.Set("Content-Type", "application/octet-stream")
		pw, _ := mw.CreatePart(h)
		_, _ = pw.Write([]byte(data))
	}
	_ = mw.Close()
	resp, body := e.request("POST", "/files", &buf, http.Header{"Content-Type": {mw.FormDataContentType()}})
	if resp.StatusCode != 200 {
		t.Fatalf("multipart upload: %d %s", resp.StatusCode, body)
	}
	var written []writtenFile
	if err := json.Unmarshal(body, &written); err != nil || len(written) != 2 {
		t.Fatalf("answer %s (%v)", body, err)
	}
	for p, want := range map[string]string{root + "/x/a.txt": "A", root + "/y/z/b.txt": "BB"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v", p, got, err)
		}
	}

	// Absolute small parts go through the agent's batch: a planted link on
	// the way is refused (the entry named), not followed, and the parts
	// before it have landed.
	outside := filepath.Join(e.dir, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, root+"/x/link"); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	mw = multipart.NewWriter(&buf)
	for _, name := range []string{root + "/x/first.txt", root + "/x/link/evil.txt"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		pw, _ := mw.CreatePart(h)
		_, _ = pw.Write([]byte("e"))
	}
	_ = mw.Close()
	if resp, body := e.request("POST", "/files", &buf, http.Header{"Content-Type": {mw.FormDataContentType()}}); resp.StatusCode != 400 || !bytes.Contains(body, []byte("link/evil.txt")) {
		t.Errorf("multipart through a planted link: %d %s, want 400 naming the entry", resp.StatusCode, body)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("written through the planted link: %v", ents)
	}
	if got, err := os.ReadFile(root + "/x/first.txt"); err != nil || string(got) != "e" {
		t.Errorf("the part before the refused one: %q %v", got, err)
	}

	// The same target twice is a 400.
	buf.Reset()
	mw = multipart.NewWriter(&buf)
	for range 2 {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+root+`/dup.txt"`)
		pw, _ := mw.CreatePart(h)
		_, _ = pw.Write([]byte("d"))
	}
	_ = mw.Close()
	if resp, body := e.request("POST", "/files", &buf, http.Header{"Content-Type": {mw.FormDataContentType()}}); resp.StatusCode != 400 {
		t.Errorf("duplicate target: %d %s", resp.StatusCode, body)
	}

	// Raw gzip upload, then download: every byte value round-trips.
	all := make([]byte, 256*1024)
	for i := range all {
		all[i] = byte(i)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(all)
	_ = zw.Close()
	resp, body = e.request("POST", "/files?path="+root+"/bin.dat", &gz, http.Header{
		"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}})
	if resp.StatusCode != 200 {
		t.Fatalf("raw upload: %d %s", resp.StatusCode, body)
	}
	resp, body = e.request("GET", "/files?path="+root+"/bin.dat", nil, nil)
	if resp.StatusCode != 200 || !bytes.Equal(body, all) || resp.Header.Get("Content-Length") != "262144" {
		t.Errorf("download: %d, %d bytes, Content-Length %q", resp.StatusCode, len(body), resp.Header.Get("Content-Length"))
	}

	for _, tc := range []struct {
		target string
		status int
	}{
		{"/files?path=" + root + "/missing", 404},
		{"/files?path=" + root, 400},
		{"/files?path=" + root + "/bin.dat&username=nosuchuser", 401},
	} {
		resp, body := e.request("GET", tc.target, nil, nil)
		var ae apiError
		if resp.StatusCode != tc.status || json.Unmarshal(body, &ae) != nil || ae.Code != tc.status || ae.Message == "" {
			t.Errorf("GET %s: %d %s, want %d with {code,message}", tc.target, resp.StatusCode, body, tc.status)
		}
	}
}

func TestEnvdRouting(t *testing.T) {
	e := newEnvdEnv(t)
	get := func(target string, h http.Header) (int, string) {
		req, _ := http.NewRequest("GET", e.url+target, nil)
		req.Header = h
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "r.txt"), []byte("r"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := "/files?path=" + filepath.Join(e.dir, "r.txt")
	tests := []struct {
		name   string
		target string
		h      http.Header
		state  sandbox.State
		status int
		body   string
	}{
		{"health", "/health", http.Header{"E2b-Sandbox-Id": {"sbxe2btest1"}, "X-Access-Token": {testToken}}, sandbox.Running, 204, ""},
		{"old SDK by token only", file, http.Header{"X-Access-Token": {testToken}}, sandbox.Running, 200, "r"},
		{"missing token", file, http.Header{"E2b-Sandbox-Id": {"sbxe2btest1"}}, sandbox.Running, 401, ""},
		{"token of another sandbox", file, http.Header{"E2b-Sandbox-Id": {"other"}, "X-Access-Token": {testToken}}, sandbox.Running, 401, ""},
		{"unknown token", "/health", http.Header{"E2b-Sandbox-Id": {"gone"}, "X-Access-Token": {"nope"}}, sandbox.Running, 502,
			`{"sandboxId":"gone","message":"sandbox not found","code":502}` + "\n"},
		{"paused", "/health", http.Header{"E2b-Sandbox-Id": {"sbxe2btest1"}, "X-Access-Token": {testToken}}, sandbox.Paused, 502,
			`{"sandboxId":"sbxe2btest1","message":"sandbox sbxe2btest1 is paused","code":502}` + "\n"},
		{"host routing", file, http.Header{"X-Access-Token": {testToken}, "Host": {"49983-sbxe2btest1.berth.test"}}, sandbox.Running, 200, "r"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.backend.setState(tt.state)
			defer e.backend.setState(sandbox.Running)
			h := tt.h.Clone()
			if host := h.Get("Host"); host != "" {
				h.Del("Host")
				req, _ := http.NewRequest("GET", e.url+tt.target, nil)
				req.Header, req.Host = h, host
				resp, err := e.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.status || string(b) != tt.body {
					t.Errorf("got %d %q, want %d %q", resp.StatusCode, b, tt.status, tt.body)
				}
				return
			}
			status, body := get(tt.target, h)
			if status != tt.status || (tt.body != "" && body != tt.body) {
				t.Errorf("got %d %q, want %d %q", status, body, tt.status, tt.body)
			}
		})
	}
	// A paused sandbox's RPCs fail as unavailable (the SDK's TimeoutError).
	e.backend.setState(sandbox.Paused)
	_, err := e.fs.Stat(context.Background(), connect.NewRequest(&filesystem.StatRequest{Path: "/"}))
	e.backend.setState(sandbox.Running)
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("paused Stat: %v, want unavailable", err)
	}
}
