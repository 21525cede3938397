package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestSnapshotStartsMany: a snapshot of a running sandbox (new files, a
// deleted file, a replaced directory) starts three sandboxes that all see
// it, without sharing writes; it is owner-scoped, refused for deletion while
// used, and becomes a template.
func TestSnapshotStartsMany(t *testing.T) {
	s := startServer(t)
	src := s.create()
	s.must("exec", "--user", "root", "--cwd", "/", src, "--", "sh", "-c",
		"echo hello > /root/kept && ln /root/kept /root/hard && ln -s /root/kept /root/soft && rm /bin/vi && "+
			"mkdir -p /opt/app/old && echo x > /opt/app/old/f && rm -rf /opt/app && mkdir -p /opt/app && echo new > /opt/app/n && "+
			"rm -rf /etc/berth-none; mkfifo /root/fifo; chmod 4755 /root/kept")
	snapOut := s.must("snapshot", src, "--name", "base", "--json")
	var snap struct {
		ID     string   `json:"id"`
		Layers []string `json:"layers"`
	}
	if err := json.Unmarshal([]byte(snapOut), &snap); err != nil || snap.ID == "" || len(snap.Layers) != 2 {
		t.Fatalf("snapshot: %s (%v)", snapOut, err)
	}
	if out := s.must("exec", "--user", "root", src, "--", "cat", "/root/kept"); out != "hello" {
		t.Fatalf("source after snapshot: %q (it must keep running)", out)
	}

	check := "cat /root/kept; stat -c '%a %h' /root/kept; readlink /root/soft; ls /opt/app; test -e /bin/vi && echo vi-back; test -p /root/fifo && echo fifo; cat /root/mine 2>/dev/null; true"
	want := "hello\n4755 2\n/root/kept\nn\nfifo"
	var kids []string
	for i := range 3 {
		id := s.must("create", "--from-snapshot", snap.ID)
		kids = append(kids, id)
		if out := s.must("exec", "--user", "root", "--cwd", "/", id, "--", "sh", "-c", check); out != want {
			t.Fatalf("sandbox %d from snapshot sees:\n%s\nwant:\n%s", i, out, want)
		}
		s.must("exec", "--user", "root", id, "--", "sh", "-c", fmt.Sprintf("echo %s > /root/mine", id))
	}
	for _, id := range kids {
		if out := s.must("exec", "--user", "root", id, "--", "cat", "/root/mine"); out != id {
			t.Fatalf("%s sees another sandbox's write: %q", id, out)
		}
	}
	if _, code := s.run("exec", "--user", "root", src, "--", "test", "-e", "/root/mine"); code == 0 {
		t.Fatal("a write in a sandbox started from the snapshot leaked into the source")
	}
	var inspect struct {
		Extra map[string]string `json:"extra"`
	}
	_ = json.Unmarshal([]byte(s.must("inspect", kids[0])), &inspect)
	if inspect.Extra["snapshot"] != snap.ID {
		t.Fatalf("inspect extra %v: want snapshot %s", inspect.Extra, snap.ID)
	}

	t.Run("owner scoped", func(t *testing.T) {
		bob := s.must("key", "create", "--owner", "bob")
		out, _ := s.runAs(bob, nil, "snapshot", "ls", "--json")
		if strings.Contains(out, snap.ID) {
			t.Fatalf("bob sees alice's snapshot: %s", out)
		}
		code, body := s.api(bob, "POST", "/v1/sandboxes", map[string]any{"from_snapshot": snap.ID})
		if code != 400 || body["field"] != "from_snapshot" {
			t.Fatalf("bob creating from another owner's snapshot: %d %v", code, body)
		}
	})

	t.Run("rm refused while used", func(t *testing.T) {
		out, code := s.run("snapshot", "rm", snap.ID)
		if code != 4 || !strings.Contains(out, "used by 3") {
			t.Fatalf("snapshot rm while used: exit %d %s", code, out)
		}
		code2, _ := s.api(s.key, "DELETE", "/v1/snapshots/"+snap.ID, nil)
		if code2 != 409 {
			t.Fatalf("DELETE while used: %d, want 409", code2)
		}
	})

	t.Run("template from snapshot", func(t *testing.T) {
		s.must("template", "from-snapshot", snap.ID, "tiny-app")
		id := s.must("create", "--template", "tiny-app")
		if out := s.must("exec", "--user", "root", "--cwd", "/", id, "--", "sh", "-c", "cat /root/kept; ls /opt/app"); out != "hello\nn" {
			t.Fatalf("sandbox from promoted template sees %q", out)
		}
		s.must("rm", "-f", id)
	})

	for _, id := range kids {
		s.must("rm", "-f", id)
	}
	s.must("snapshot", "rm", snap.ID)
	if out := s.must("snapshot", "ls", "--json"); strings.Contains(out, snap.ID) {
		t.Fatalf("snapshot still listed after rm: %s", out)
	}
}
