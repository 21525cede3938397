package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLifecycleThroughCLI(t *testing.T) {
	s := startServer(t)
	id := s.create("--label", "team=a", "--label", "job=1", "--env", "GREETING=hi", "--ttl", "10m")
	if len(id) != 20 || strings.ContainsAny(id, "-_") {
		t.Fatalf("id %q: want 20 chars of [a-z0-9]", id)
	}

	t.Run("exec output and exit codes", func(t *testing.T) {
		if out := s.must("exec", id, "--", "sh", "-c", "echo $GREETING; echo err >&2"); out != "hi\nerr" && out != "err\nhi" {
			t.Fatalf("exec output %q", out)
		}
		if _, code := s.run("exec", id, "--", "sh", "-c", "exit 3"); code != 3 {
			t.Fatalf("exit code %d, want 3", code)
		}
		if out := s.must("exec", "--env", "GREETING=yo", id, "--", "sh", "-c", "echo $GREETING"); out != "yo" {
			t.Fatalf("--env did not override: %q", out)
		}
		if out := s.must("exec", id, "--", "whoami"); out != "user" {
			t.Fatalf("default user %q, want user", out)
		}
		if out := s.must("exec", "--user", "root", "--cwd", "/tmp", id, "--", "sh", "-c", "whoami; pwd"); out != "root\n/tmp" {
			t.Fatalf("root in /tmp: %q", out)
		}
		if out := s.must("exec", id, "--", "hostname"); out != id {
			t.Fatalf("hostname %q, want the sandbox id", out)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		out, _, code := s.runSplit(s.key, strings.NewReader("line1\nline2\n"), "exec", "-i", id, "--", "wc", "-l")
		if code != 0 || strings.TrimSpace(out) != "2" {
			t.Fatalf("wc -l over stdin: %q exit %d", out, code)
		}
	})

	t.Run("cp both ways", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "blob")
		data := make([]byte, 3<<20)
		_, _ = rand.Read(data)
		if err := os.WriteFile(local, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s.must("cp", local, id+":/home/user/dir/blob")
		back := filepath.Join(t.TempDir(), "back")
		s.must("cp", id+":/home/user/dir/blob", back)
		got, err := os.ReadFile(back)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip mismatch (err %v, %d bytes)", err, len(got))
		}
		if out := s.must("exec", id, "--", "stat", "-c", "%U", "/home/user/dir/blob"); out != "user" {
			t.Fatalf("uploaded file owner %q, want user", out)
		}
		if _, code := s.run("cp", id+":/nope", back); code != 3 {
			t.Fatalf("cp of a missing file: exit %d, want 3 (not found)", code)
		}
	})

	t.Run("ls filters", func(t *testing.T) {
		other := s.create("--label", "team=b")
		var list []struct {
			ID    string
			State string
		}
		out := s.must("ls", "--json", "--label", "team=a")
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].ID != id {
			t.Fatalf("ls --label team=a: %s", out)
		}
		s.must("stop", other)
		out = s.must("ls", "--json", "--state", "stopped")
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].ID != other {
			t.Fatalf("ls --state stopped: %s", out)
		}
		s.must("rm", other)
	})

	t.Run("stop keeps the workspace, start boots it again", func(t *testing.T) {
		s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/state")
		s.must("stop", id)
		if _, code := s.run("exec", id, "--", "true"); code == 0 {
			t.Fatal("exec into a stopped sandbox succeeded")
		}
		s.must("start", id)
		if out := s.must("exec", id, "--", "cat", "/home/user/state"); out != "kept" {
			t.Fatalf("after stop/start: %q", out)
		}
	})

	t.Run("events", func(t *testing.T) {
		out := s.must("events", id, "--json")
		var evs []struct{ Type, From, To, Reason string }
		if err := json.Unmarshal([]byte(out), &evs); err != nil {
			t.Fatal(err)
		}
		var trail []string
		for _, e := range evs {
			if e.Type == "transition" && e.To != "" {
				trail = append(trail, e.From+">"+e.To)
			}
		}
		want := "creating>running running>stopped stopped>running"
		if strings.Join(trail, " ") != want {
			t.Fatalf("transitions %v, want %s", trail, want)
		}
	})

	t.Run("inspect and extend", func(t *testing.T) {
		out := s.must("inspect", id)
		var sb map[string]any
		if err := json.Unmarshal([]byte(out), &sb); err != nil || sb["owner"] != "admin" || sb["state"] != "running" {
			t.Fatalf("inspect: %s", out)
		}
		s.must("extend", id, "--ttl", "2h")
	})

	t.Run("rm removes everything", func(t *testing.T) {
		s.must("rm", id)
		if _, code := s.run("inspect", id); code != 3 {
			t.Fatalf("inspect after rm: exit %d, want 3", code)
		}
		s.settled(id) // the teardown ends after the answer
		if _, err := os.Stat(filepath.Join(s.dataDir, "sandboxes", id)); !os.IsNotExist(err) {
			t.Fatalf("sandbox dir still there: %v", err)
		}
		assertNoLeftovers(t, s.dataDir, true)
	})
}

func TestOwnerIsolation(t *testing.T) {
	s := startServer(t)
	alice := s.must("key", "create", "--owner", "alice")
	bob := s.must("key", "create", "--owner", "bob")
	out, code := s.runAs(alice, nil, "create", "--template", "tiny")
	if code != 0 {
		t.Fatalf("alice create: %s", out)
	}
	id := strings.TrimSpace(out)
	for _, args := range [][]string{{"inspect", id}, {"exec", id, "--", "true"}, {"stop", id}, {"rm", id}, {"cp", id + ":/etc/passwd", "-"}} {
		if out, code := s.runAs(bob, nil, args...); code != 3 {
			t.Errorf("bob %v: exit %d (%s), want 3 (not found)", args, code, out)
		}
	}
	out, _ = s.runAs(bob, nil, "ls", "--json")
	if strings.Contains(out, id) {
		t.Errorf("bob's ls shows alice's sandbox: %s", out)
	}
	if code, _ := s.api(bob, "POST", "/v1/keys", map[string]string{"owner": "bob2"}); code != 403 {
		t.Errorf("non-admin key create: HTTP %d, want 403", code)
	}
	if code, _ := s.api("", "GET", "/v1/sandboxes", nil); code != 401 {
		t.Errorf("no key: HTTP %d, want 401", code)
	}
	if out, code := s.runAs(alice, nil, "exec", id, "--", "echo", "mine"); code != 0 || strings.TrimSpace(out) != "mine" {
		t.Errorf("alice exec: %d %s", code, out)
	}
}

func TestBadInputNamesTheField(t *testing.T) {
	s := startServer(t)
	cases := []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"template": "nope"}, "template"},
		{map[string]any{"template": "tiny", "ttl": "forever"}, "ttl"},
		{map[string]any{"template": "tiny", "ttl": "9999h"}, "ttl"},
		{map[string]any{"template": "tiny", "memory_mib": 1}, "memory"},
		{map[string]any{"template": "tiny", "disk_mib": -5}, "disk"},
		{map[string]any{"template": "tiny", "cpu": 1000}, "cpu"},
		{map[string]any{"template": "tiny", "labels": map[string]string{"bad=key": "x"}}, "labels"},
		{map[string]any{"template": "tiny", "runtime": "docker"}, "runtime"},
		{map[string]any{"template": "tiny", "expiry_action": "explode"}, "expiry_action"},
		{map[string]any{"template": "tiny", "colour": "red"}, "colour"},
		{map[string]any{"template": 7}, "template"},
	}
	for _, c := range cases {
		code, body := s.api(s.key, "POST", "/v1/sandboxes", c.body)
		if code != 400 || body["field"] != c.field || body["code"] != float64(400) {
			t.Errorf("create %v: HTTP %d %v, want 400 naming %q", c.body, code, body, c.field)
		}
	}
	if out, code := s.run("create", "--template", "tiny", "--ttl", "soon"); code != 2 || !strings.Contains(out, "ttl") {
		t.Errorf("CLI bad ttl: exit %d %s", code, out)
	}
	list, _ := s.api(s.key, "GET", "/v1/sandboxes?state=running", nil)
	if list != 200 {
		t.Errorf("list after bad creates: %d", list)
	}
	out := s.must("ls", "--json")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("bad input left sandboxes behind: %s", out)
	}
}
