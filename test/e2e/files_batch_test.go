package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/safefs"
	"github.com/berth-dev/berth/internal/testutil"
)

// batchPost sends body (a tar) to POST /v1/sandboxes/{id}/files:batch.
func (s *server) batchPost(id, dir string, body io.Reader) (int, wire.BatchResult, string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/sandboxes/"+id+"/files:batch?path="+dir, body)
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var res wire.BatchResult
	_ = json.Unmarshal(b, &res)
	return resp.StatusCode, res, string(b)
}

// tarEntry writes one regular file (or, with body "/", a directory).
func tarFile(t *testing.T, tw *tar.Writer, name, body string) {
	t.Helper()
	h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}
	if body == "/" {
		h = &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}
	}
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	if h.Typeflag == tar.TypeReg {
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFilesBatchAttackedFromInside: root inside a real sandbox plants links
// beneath the batch's directory and swaps a directory and a file for links
// while a batch is in flight; nothing lands outside the directory (in the
// sandbox's /etc or on the host), and a directory copied with berth cp both
// ways round-trips, written as the sandbox's user.
func TestFilesBatchAttackedFromInside(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			canaryDir := t.TempDir()
			canary := filepath.Join(canaryDir, "canary")
			if err := os.WriteFile(canary, []byte("host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			intact := func(when string) {
				t.Helper()
				if b, err := os.ReadFile(canary); err != nil || string(b) != "host\n" {
					t.Fatalf("%s: the host canary changed: %q %v", when, b, err)
				}
				if ents, _ := os.ReadDir(canaryDir); len(ents) != 1 {
					t.Fatalf("%s: files appeared beside the host canary: %v", when, ents)
				}
			}
			id := s.create("--runtime", rt)
			passwd := s.must("exec", id, "--", "cat", "/etc/passwd")
			sandboxIntact := func(when string) {
				t.Helper()
				if got := s.must("exec", id, "--", "cat", "/etc/passwd"); got != passwd {
					t.Fatalf("%s: the sandbox's /etc/passwd changed:\n%s", when, got)
				}
				if out := s.must("exec", "--user", "root", id, "--", "sh", "-c", "ls -A /etc | grep -c berth || true"); out != "0" {
					t.Fatalf("%s: temporaries left in /etc: %s", when, out)
				}
			}
			// Planted: links to the sandbox's /etc, to the host canary's path
			// and (relative) up and out of the directory.
			s.must("exec", "--user", "root", id, "--", "sh", "-c",
				"mkdir -p /home/user/w && cd /home/user/w && ln -s /etc etc && ln -s "+canaryDir+" host && ln -s ../../../etc up && ln -s /etc/passwd pw")

			for _, name := range []string{"etc/passwd", "host/canary", "up/passwd", "etc/new", "../../../etc/passwd", "/etc/passwd"} {
				var buf bytes.Buffer
				tw := tar.NewWriter(&buf)
				tarFile(t, tw, name, "pwned\n")
				_ = tw.Close()
				code, _, msg := s.batchPost(id, "/home/user/w", &buf)
				if code != http.StatusBadRequest || !strings.Contains(msg, name) && !strings.Contains(msg, strings.Split(name, "/")[0]) {

					t.Fatalf("entry %q: HTTP %d %s, want 400 naming the entry", name, code, msg)
				}
			}
			// A final link is replaced by the file, never written through.
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tarFile(t, tw, "pw", "mine\n")
			_ = tw.Close()
			if code, res, msg := s.batchPost(id, "/home/user/w", &buf); code != http.StatusOK || res.Files != 1 || res.Durable != "syncfs" {
				t.Fatalf("write over a planted link: HTTP %d %s", code, msg)
			}
			if out := s.must("exec", id, "--", "sh", "-c", "test -L /home/user/w/pw && echo link; cat /home/user/w/pw"); out != "mine" {
				t.Fatalf("pw after the batch: %q", out)
			}
			sandboxIntact("planted links")
			intact("planted links")

			// Mid-batch swaps: the batch streams through a pipe; after its
			// first entries have landed, root swaps the directory they went
			// to and a file it wrote for links out; the batch then writes
			// into both names again.
			s.must("exec", "--user", "root", id, "--", "mkdir", "-p", "/home/user/m")
			pr, pw := io.Pipe()
			type answer struct {
				code int
				msg  string
			}
			done := make(chan answer, 1)
			go func() {
				code, _, msg := s.batchPost(id, "/home/user/m", pr)
				done <- answer{code, msg}
			}()
			tw = tar.NewWriter(pw)
			tarFile(t, tw, "sub/", "/")
			tarFile(t, tw, "sub/a", "first\n")
			tarFile(t, tw, "f", "first\n")
			// Padding pushes the entries above through every buffer on the way.
			tarFile(t, tw, "pad", strings.Repeat("p", 1<<20))
			_ = tw.Flush()
			testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
				if _, code := s.run("exec", id, "--", "test", "-f", "/home/user/m/f"); code != 0 {
					return fmt.Errorf("the batch's first entries have not landed")
				}
				return nil
			})
			s.must("exec", "--user", "root", id, "--", "sh", "-c",
				"cd /home/user/m && mv sub sub.old && ln -s /etc sub && rm f && ln -s /etc/passwd f")
			tarFile(t, tw, "sub/passwd", "pwned\n")
			tarFile(t, tw, "f", "second\n")
			_ = tw.Close()
			_ = pw.Close()
			a := <-done
			t.Logf("%s: the batch after the swaps: HTTP %d %s", rt, a.code, a.msg)
			sandboxIntact("mid-batch swaps")
			intact("mid-batch swaps")
			if a.code == http.StatusOK {
				// Written into the directory it had opened (now sub.old), and f
				// replaced the link.
				if out := s.must("exec", id, "--", "sh", "-c", "test -L /home/user/m/f && echo link; cat /home/user/m/f /home/user/m/sub.old/passwd"); out != "second\npwned" {
					t.Fatalf("f and sub.old/passwd after the swaps: %q", out)
				}
			}

			// berth cp of a directory, both ways: 200 files in nested dirs.
			src := t.TempDir()
			for i := range 200 {
				p := filepath.Join(src, fmt.Sprintf("d%d", i%7), fmt.Sprintf("f%03d", i))
				_ = os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(strings.Repeat(fmt.Sprint(i), 100)), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(canary, filepath.Join(src, "link")); err != nil {
				t.Fatal(err)
			}
			s.must("cp", src, id+":/home/user/tree")
			if out := s.must("exec", id, "--", "sh", "-c", "find /home/user/tree -type f | wc -l; stat -c '%U %a' /home/user/tree/d3/f003; test -e /home/user/tree/link || echo nolink"); out != "200\nuser 640\nnolink" {
				t.Fatalf("after cp up: %q", out)
			}
			// A link inside the sandbox's tree, to the host canary's path, is
			// not created on the host by the download.
			s.must("exec", "--user", "root", id, "--", "ln", "-s", canary, "/home/user/tree/d0/evil")
			dst := filepath.Join(t.TempDir(), "back")
			s.must("cp", id+":/home/user/tree", dst)
			for i := range 200 {
				p := fmt.Sprintf("d%d/f%03d", i%7, i)
				b, err := os.ReadFile(filepath.Join(dst, p))
				if err != nil || string(b) != strings.Repeat(fmt.Sprint(i), 100) {
					t.Fatalf("%s after the round trip: %v", p, err)
				}
			}
			if _, err := os.Lstat(filepath.Join(dst, "d0", "evil")); !os.IsNotExist(err) {
				t.Fatalf("the sandbox's link was created on the host: %v", err)
			}
			intact("cp both ways")
			s.must("rm", "-f", id)
		})
	}
}

// TestFilesBatchHostBarrier: the batch's durability barrier is taken on the
// host (one syncfs of the workspace image), which is only the same promise
// if the runtime holds no written data of its own. Right after the answer,
// before anything in the sandbox is asked to flush, every file of the batch
// is read from the host's workspace upper dir (beneath it, no symlinks
// followed) with its bytes and bits.
func TestFilesBatchHostBarrier(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			want := map[string]string{}
			modes := map[string]os.FileMode{}
			for i := range 300 {
				name := fmt.Sprintf("d%d/f%03d", i%5, i)
				body := strings.Repeat(fmt.Sprintf("%d-%s.", i, rt), 1+i*13%400)
				mode := []os.FileMode{0o644, 0o600, 0o750}[i%3]
				if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: int64(mode), Size: int64(len(body))}); err != nil {
					t.Fatal(err)
				}
				_, _ = io.WriteString(tw, body)
				want[name], modes[name] = body, mode
			}
			_ = tw.Close()
			code, res, msg := s.batchPost(id, "/home/user/hb", &buf)
			if code != http.StatusOK || res.Files != 300 || res.Durable != "syncfs" {
				t.Fatalf("batch: HTTP %d %s", code, msg)
			}
			up, err := safefs.OpenRoot(filepath.Join(s.dataDir, "sandboxes", id, "ws", "upper"))
			if err != nil {
				t.Fatal(err)
			}
			defer up.Close()
			for name, body := range want {
				b, err := up.ReadFile("home/user/hb/"+name, 1<<20)
				if err != nil || string(b) != body {
					t.Fatalf("%s on the host right after the answer: %d bytes, %v; want %d", name, len(b), err, len(body))
				}
				st, err := up.Lstat("home/user/hb/" + name)
				if err != nil || os.FileMode(st.Mode&0o7777) != modes[name] {
					t.Fatalf("%s on the host: mode %o %v, want %o", name, st.Mode&0o7777, err, modes[name])
				}
			}
			// No temporaries left beside the files.
			if out := s.must("exec", id, "--", "sh", "-c", "find /home/user/hb -name '.*berth*' | wc -l; find /home/user/hb -type f | wc -l"); out != "0\n300" {
				t.Fatalf("the batch's directory holds: %q", out)
			}
			s.must("rm", "-f", id)
		})
	}
}
