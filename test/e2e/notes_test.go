package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// noteJSON runs `berth note ARGS --json` and decodes a note.
func (s *server) noteJSON(args ...string) wire.Note {
	s.t.Helper()
	var n wire.Note
	out := s.must(append([]string{"note"}, append(args, "--json")...)...)
	if err := json.Unmarshal([]byte(out), &n); err != nil {
		s.t.Fatalf("note --json: %v\n%s", err, out)
	}
	return n
}

func (s *server) currentNote(id string) wire.CurrentNote {
	s.t.Helper()
	var c wire.CurrentNote
	out := s.must("note", id, "--json")
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		s.t.Fatalf("note --json: %v\n%s", err, out)
	}
	return c
}

func changed(n wire.Note) map[string]string {
	out := map[string]string{}
	for _, c := range n.Files.Changes {
		out[c.Path] = c.Kind
	}
	return out
}

func repoAt(n wire.Note, path string) *wire.NoteRepo {
	for i := range n.Repos {
		if n.Repos[i].Path == path {
			return &n.Repos[i]
		}
	}
	return nil
}

// startDefaultServer is a server with the default template ready (it has git).
func startDefaultServer(t *testing.T) *server {
	t.Helper()
	tars, _ := filepath.Glob("/var/cache/berth/rootfs/default-*.tar")
	if len(tars) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("no default template in /var/cache/berth/rootfs (scripts/setup.sh builds it)")
		}
		t.Skip("no default template in /var/cache/berth/rootfs")
	}
	s := startServer(t, "--no-default-template=false")
	rpWaitFor(t, 5*time.Minute, "template default to be ready", func() bool {
		out, _ := s.run("template", "ls")
		return containsLine(out, "default", "ready")
	})
	return s
}

// TestHandoffNotes (runc and runsc, default template): a note after
// editing files in a git repository lists them (added and modified
// files, the branch, dirty files, the unpushed commit); a pause writes a
// note listing what changed since the previous one and resume returns
// it; a fork inherits the newest note; a rewind to a checkpoint returns
// the note of that point with a desync naming the agent's newer context
// version.
func TestHandoffNotes(t *testing.T) {
	s := startDefaultServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			handoffNotes(t, s, rt)
		})
	}
	s.stopRunsc()
}

func handoffNotes(t *testing.T, s *server, rt string) {
	id := s.must("create", "--template", "default", "--runtime", rt)
	if c := s.currentNote(id); c.Note != nil {
		t.Fatalf("a new sandbox has a note: %+v", c.Note)
	}
	s.must("exec", id, "--", "sh", "-c", `set -e; mkdir -p ~/proj && cd ~/proj && git init -q -b main &&
		git config user.email a@example.com && git config user.name agent &&
		echo one > a.txt && git add a.txt && git commit -qm 'first commit' &&
		echo two >> a.txt && echo new > b.txt`)
	n1 := s.noteJSON(id, "--write", "--reason", "checking in", "--next", "commit b.txt", "--context-version", "ctx-1")
	if !n1.Collected || n1.Trigger != "demand" || n1.Reason != "checking in" || n1.ContextVersion != "ctx-1" || n1.Files.SinceSeq != 0 {
		t.Fatalf("first note: %+v", n1)
	}
	ch := changed(n1)
	if ch["home/user/proj/a.txt"] != "added" || ch["home/user/proj/b.txt"] != "added" {
		t.Errorf("first note's files (against the template) miss the edits: %v", ch)
	}
	r := repoAt(n1, "/home/user/proj")
	if r == nil {
		t.Fatalf("first note has no repository /home/user/proj: %+v (git error %q)", n1.Repos, n1.GitError)
	}
	if r.Branch != "main" || !slices.Contains(r.Dirty, " M a.txt") || !slices.Contains(r.Dirty, "?? b.txt") || r.DirtyTotal != 2 ||
		r.UnpushedTotal != 1 || len(r.Unpushed) != 1 || !strings.HasSuffix(r.Unpushed[0], " first commit") || r.Head == "" {
		t.Errorf("git state of /home/user/proj: %+v", *r)
	}
	ck := s.checkpoint(s.key, id, "--name", "c1")

	// Pause writes a note; it lists only what changed since n1.
	s.must("exec", id, "--", "sh", "-c", "cd ~/proj && echo three > c.txt && rm b.txt")
	s.must("exec", "--user", "root", id, "--", "rm", "/etc/issue") // a template file: a whiteout
	n2 := s.noteJSON(id, "--write", "--context-version", "ctx-2")  // the agent moves on
	if ch := changed(n2); len(ch) != 3 || ch["home/user/proj/c.txt"] != "added" || ch["home/user/proj/b.txt"] != "deleted" || ch["etc/issue"] != "deleted" ||
		n2.Files.SinceSeq != n1.Seq {
		t.Errorf("second note lists %v since #%d, want c.txt added, b.txt and /etc/issue deleted since #%d", ch, n2.Files.SinceSeq, n1.Seq)
	}
	s.must("exec", id, "--", "sh", "-c", "cd ~/proj && echo four > d.txt")
	s.must("pause", id, "--mode", "freeze")
	cur := s.currentNote(id)
	if cur.Note == nil || cur.Note.Trigger != "pause" || !cur.Note.Collected {
		t.Fatalf("after pause the current note is %+v, want the pause note", cur.Note)
	}
	pn := *cur.Note
	if ch := changed(pn); len(ch) != 1 || ch["home/user/proj/d.txt"] != "added" {
		t.Errorf("pause note lists %v, want only d.txt added since the previous note", ch)
	}
	if pn.ContextVersion != "ctx-2" || pn.Next != "commit b.txt" {
		t.Errorf("pause note did not carry the agent's fields forward: context %q next %q", pn.ContextVersion, pn.Next)
	}
	code, body := s.api(s.key, "POST", "/v1/sandboxes/"+id+"/resume", nil)
	if code != 200 || body["state"] != "running" || body["id"] != id {
		t.Fatalf("resume: %d %v", code, body)
	}
	note, _ := body["note"].(map[string]any)
	if note == nil || note["trigger"] != "pause" || note["seq"] != float64(pn.Seq) {
		t.Fatalf("resume answer's note = %v, want the pause note #%d", note, pn.Seq)
	}

	// A fork's first note is the parent's newest, marked inherited.
	child := s.fork(id, 1).Sandboxes[0].ID
	defer s.run("rm", "-f", child)
	cn := s.currentNote(child)
	if cn.Note == nil || cn.Note.InheritedFrom == nil || cn.Note.InheritedFrom.SandboxID != id || cn.Note.Trigger != "fork" || cn.Note.SandboxID != child {
		t.Fatalf("child's note = %+v, want one inherited from %s", cn.Note, id)
	}
	// Its next note counts from the inherited one.
	s.must("exec", child, "--", "sh", "-c", "echo kid > ~/proj/kid.txt")
	// (The fork gave the child its own /etc/machine-id: listed too.)
	if kn := s.noteJSON(child, "--write"); kn.Files.SinceSeq != cn.Note.Seq || changed(kn)["home/user/proj/kid.txt"] != "added" || len(kn.Files.Changes) > 2 {
		t.Errorf("child's own note: since %d (want %d), files %v", kn.Files.SinceSeq, cn.Note.Seq, changed(kn))
	}

	// Rewind to c1: the note of that point (n1), with a desync.
	rw := s.rewind(id, ck.ID)
	if rw.Note == nil || rw.Note.Trigger != "restore" || rw.Note.RestoredFrom == nil || rw.Note.RestoredFrom.Seq != n1.Seq {
		t.Fatalf("rewind's note = %+v, want the restore of note #%d", rw.Note, n1.Seq)
	}
	if len(rw.Note.Warnings) == 0 || !strings.Contains(rw.Note.Warnings[0], "desync") {
		t.Errorf("rewind's note has no desync warning: %v", rw.Note.Warnings)
	}
	if rw.Desync == nil || rw.Desync.AgentVersion != "ctx-2" || rw.Desync.MachineVersion != "ctx-1" {
		t.Errorf("rewind desync = %+v, want agent ctx-2 machine ctx-1", rw.Desync)
	}
	if c := s.currentNote(id); c.Desync == nil || c.Note.Seq != rw.Note.Seq {
		t.Errorf("after the rewind `berth note` = %+v", c)
	}
	// The agent answers with a version: the desync is over, and the
	// next note counts from the restored point's manifest.
	after := s.noteJSON(id, "--write", "--context-version", "ctx-3")
	if after.Desync != nil || after.Files.SinceSeq != rw.Note.Seq {
		t.Errorf("note after the rewind: desync %+v since %d (want none, since %d)", after.Desync, after.Files.SinceSeq, rw.Note.Seq)
	}
	if ch := changed(after); len(ch) != 0 {
		t.Errorf("note right after the rewind lists changes %v, want none (the machine is the point's)", ch)
	}
	if list := s.must("note", id, "--list"); !strings.Contains(list, "restore") || !strings.Contains(list, "pause") {
		t.Errorf("note --list:\n%s", list)
	}

	// A new sandbox from an older snapshot of id: the note of that point,
	// and a desync once the agent has moved on since the snapshot.
	var snap wire.Snapshot
	if err := json.Unmarshal([]byte(s.must("snapshot", id, "--json")), &snap); err != nil {
		t.Fatal(err)
	}
	defer s.run("snapshot", "rm", snap.ID)
	s.noteJSON(id, "--write", "--context-version", "ctx-4")
	restored := s.must("create", "--from-snapshot", snap.ID)
	defer s.run("rm", "-f", restored)
	rn := s.currentNote(restored)
	if rn.Note == nil || rn.Note.Trigger != "restore" || rn.Note.RestoredFrom == nil || rn.Note.RestoredFrom.SandboxID != id ||
		rn.Note.RestoredFrom.Seq != after.Seq || rn.Note.SandboxID != restored {
		t.Fatalf("note of the sandbox made from the snapshot: %+v, want the restore of %s's note #%d", rn.Note, id, after.Seq)
	}
	if rn.Desync == nil || rn.Desync.AgentVersion != "ctx-4" || rn.Desync.MachineVersion != "ctx-3" {
		t.Errorf("from-snapshot desync = %+v, want agent ctx-4 machine ctx-3", rn.Desync)
	}
	s.must("rm", "-f", id)
}

// TestHandoffNoteHostileRepo (runc and runsc): sandbox root plants a
// repository whose .git is a symlink to /etc, 25 repositories, and a fake
// `git` first in PATH that answers endlessly. The note is written within
// its bounds (no link followed, at most 20 repositories, lines and counts
// capped), pause still completes, and the host's /etc is untouched.
func TestHandoffNoteHostileRepo(t *testing.T) {
	s := startDefaultServer(t)
	hostEtc := func() [32]byte {
		h := sha256.New()
		for _, f := range []string{"/etc/passwd", "/etc/hostname", "/etc/hosts"} {
			b, _ := os.ReadFile(f)
			h.Write(b)
			if fi, err := os.Stat(f); err == nil {
				h.Write([]byte(fi.ModTime().String()))
			}
		}
		var out [32]byte
		copy(out[:], h.Sum(nil))
		return out
	}
	before := hostEtc()
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			id := s.must("create", "--template", "default", "--runtime", rt)
			defer s.run("rm", "-f", id)
			s.must("exec", "--user", "root", id, "--", "sh", "-c", `set -e
				mkdir -p /home/user/evil && ln -s /etc /home/user/evil/.git && echo x > /home/user/evil/f
				for i in $(seq 1 25); do mkdir -p /home/user/r$i && git -C /home/user/r$i init -q; done
				printf '#!/bin/sh\nexec yes "$(head -c 2000 /dev/zero | tr "\\0" A)"\n' > /usr/local/bin/git
				chmod 755 /usr/local/bin/git`)
			start := time.Now()
			n := s.noteJSON(id, "--write")
			took := time.Since(start)
			if !n.Collected {
				t.Fatalf("note not collected: %+v", n)
			}
			if len(n.Repos) > 20 || n.ReposTotal < 26 {
				t.Errorf("%d repositories listed of %d, want at most 20 of the 26 planted", len(n.Repos), n.ReposTotal)
			}
			if r := repoAt(n, "/home/user/evil"); r == nil || !strings.Contains(r.Error, "symbolic link") || r.Branch != "" || len(r.Dirty) != 0 {
				t.Errorf("the .git symlink repository: %+v, want it listed and refused", r)
			}
			for _, r := range n.Repos {
				if len(r.Dirty) > 50 || len(r.Unpushed) > 50 || len(r.Branch) > 512 || len(r.Head) > 512 {
					t.Errorf("repository %s exceeds the bounds: %d dirty, %d unpushed, branch %d bytes", r.Path, len(r.Dirty), len(r.Unpushed), len(r.Branch))
				}
				for _, l := range append(append([]string{}, r.Dirty...), r.Unpushed...) {
					if len(l) > 512 {
						t.Errorf("a line of %d bytes in %s", len(l), r.Path)
					}
				}
			}
			if n.GitError == "" {
				t.Errorf("the endless fake git left no git error (want cut or timed out): %+v", n.Repos)
			}
			b, _ := json.Marshal(n)
			if len(b) > 1<<20 {
				t.Errorf("the note is %d bytes", len(b))
			}
			t.Logf("hostile note written in %s (%d bytes, git: %s)", took, len(b), n.GitError)
			// A git that never answers: the note is written at its deadline.
			s.must("exec", "--user", "root", id, "--", "sh", "-c", `printf '#!/bin/sh\nexec sleep 1000\n' > /usr/local/bin/git`)
			start = time.Now()
			n = s.noteJSON(id, "--write")
			if took := time.Since(start); n.GitError == "" || took > 30*time.Second {
				t.Errorf("a silent git: note after %s, git error %q (want it cut at the note's deadline)", took, n.GitError)
			} else {
				t.Logf("silent git: note written in %s (git: %s)", took, n.GitError)
			}
			// A pause still completes, with its note.
			s.must("pause", id, "--mode", "freeze")
			if c := s.currentNote(id); c.Note == nil || c.Note.Trigger != "pause" {
				t.Errorf("pause note after the hostile repos: %+v", c.Note)
			}
			s.must("resume", id)
			// The agent's fields are bounded at the API.
			if out, code := s.run("note", id, "--write", "--reason", strings.Repeat("r", 4097)); code == 0 || !strings.Contains(out, "reason") {
				t.Errorf("a 4097-byte reason was accepted: %d %s", code, out)
			}
		})
	}
	if hostEtc() != before {
		t.Fatal("the host's /etc changed")
	}
	s.stopRunsc()
}

// TestHandoffNoteFromInside (runc and runsc): the agent sets its fields
// from inside the sandbox, as root, through the in-sandbox API
// (docs/STATE.md) and reads its note; another sandbox's notes can be
// neither read nor written, and the field bounds hold. It needs the
// `self` transport (berth-agent api) of issue 17's in-sandbox API.
func TestHandoffNoteFromInside(t *testing.T) {
	s := startServer(t)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			noteFromInside(t, s, rt)
		})
	}
	s.stopRunsc()
}

func noteFromInside(t *testing.T, s *server, rt string) {
	id := s.create("--runtime", rt)
	other := s.create("--runtime", rt)
	defer s.run("rm", "-f", id, other)
	s.must("note", other, "--write", "--reason", "secret plans")
	out := s.must("exec", "--user", "root", id, "--", "/.berth/berth-agent", "api", "POST", "/v1/sandboxes/self/note",
		`{"reason":"stopping for lunch","next":"run the tests","context_version":"ctx-inside"}`)
	if !strings.Contains(out, "stopping for lunch") {
		t.Fatalf("in-sandbox note write answered %s", out)
	}
	c := s.currentNote(id)
	if c.Note == nil || c.Note.Reason != "stopping for lunch" || c.Note.ContextVersion != "ctx-inside" || !strings.HasPrefix(c.Note.Actor, "sandbox") {
		t.Fatalf("note written from inside: %+v", c.Note)
	}
	if out := s.must("exec", "--user", "root", id, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/self/note"); !strings.Contains(out, "ctx-inside") {
		t.Errorf("in-sandbox read: %s", out)
	}
	for _, req := range [][]string{{"GET", "/v1/sandboxes/" + other + "/notes"}, {"GET", "/v1/sandboxes/" + other + "/note"},
		{"POST", "/v1/sandboxes/" + other + "/note", `{"reason":"forged"}`}} {
		out, code := s.run(append([]string{"exec", "--user", "root", id, "--", "/.berth/berth-agent", "api"}, req...)...)
		if code == 0 || strings.Contains(out, "secret plans") {
			t.Errorf("%v from inside %s: exit %d, %s (want refused)", req, id, code, out)
		}
	}
	if c := s.currentNote(other); c.Note == nil || c.Note.Reason != "secret plans" {
		t.Errorf("the other sandbox's note changed: %+v", c.Note)
	}
	// What a sandbox supplies is bounded here too.
	big := `{"reason":"` + strings.Repeat("x", 5000) + `"}`
	if out, code := s.run("exec", "--user", "root", id, "--", "/.berth/berth-agent", "api", "POST", "/v1/sandboxes/self/note", big); code == 0 || !strings.Contains(out, "reason") {
		t.Errorf("a 5000-byte reason from inside: exit %d, %s", code, out)
	}
}

// TestHandoffNoteOnE2BConnect: E2B's connect resumes a paused sandbox
// and its answer carries the pause note beside E2B's own fields (which
// the SDKs read; they ignore the extra ones: node_modules/e2b's connect
// returns only sandboxID, domain, envdVersion and the tokens).
func TestHandoffNoteOnE2BConnect(t *testing.T) {
	s := startServer(t)
	id := s.create()
	defer s.run("rm", "-f", id)
	s.must("note", id, "--write", "--next", "resume the build", "--context-version", "ctx-e2b")
	s.must("pause", id, "--mode", "freeze")
	c, body := s.e2b("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300})
	if c != 201 || body["sandboxID"] != id || body["envdAccessToken"] == "" {
		t.Fatalf("connect: %d %v", c, body)
	}
	note, _ := body["note"].(map[string]any)
	if note == nil || note["trigger"] != "pause" || note["next"] != "resume the build" || note["context_version"] != "ctx-e2b" {
		t.Fatalf("connect's note = %v, want the pause note", body["note"])
	}
	if _, ok := body["desync"]; ok {
		t.Errorf("connect reports a desync for an unchanged context: %v", body["desync"])
	}
}
