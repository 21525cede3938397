package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestConsoleFleet: sign in with the admin key in a real browser; the fleet
// lists sandboxes created through the API, and follows a pause.
func TestConsoleFleet(t *testing.T) {
	s := startServer(t)
	a := s.create()
	bID := s.create()
	b := startBrowser(t, s)
	b.open("#/fleet")
	b.waitText("#signin", "API key")
	b.screenshots("signin")
	b.signIn(s.key)
	b.waitText("#sandboxes", a)
	b.waitText("#sandboxes", bID)
	b.screenshots("fleet")

	s.must("pause", a)
	b.waitText(`#sandboxes tr[data-id="`+a+`"]`, "paused")
	b.waitText(`#state-counts tr[data-state="paused"] .count`, `^1$`)
	b.waitText(`#state-counts tr[data-state="running"] .count`, `^1$`)
	b.run(chromedp.SetValue(chromedp.CSS("#f-group"), "owner"))
	b.eval(`document.querySelector("#f-group").dispatchEvent(new Event("change")), true`, new(bool))
	b.waitText(`#state-counts tr[data-group="admin"] .count`, `^2$`)
	b.waitText(`#state-counts tr[data-group="admin"]`, `1\.0 GiB`) // two 512 MiB limits

	// The filters narrow the list to the paused one.
	b.run(chromedp.SetValue(chromedp.CSS("#f-state"), "paused"))
	b.eval(`document.querySelector("#f-state").dispatchEvent(new Event("change")), true`, new(bool))
	b.waitText("#fleet-status", "^1 of 2 shown$")
	if got := b.text("#sandboxes"); strings.Contains(got, bID) {
		t.Errorf("state filter paused still lists running %s", bID)
	}

	// Sign out deletes the session: the cookie no longer opens the API.
	b.run(chromedp.Click(chromedp.CSS("#signout")))
	b.waitText("#signin", "API key")
	if code, _ := b.fetch("GET", "/v1/sandboxes", "", nil); code != http.StatusUnauthorized {
		t.Errorf("after sign-out GET /v1/sandboxes = %d, want 401", code)
	}
}

// TestConsoleSandbox: a sandbox page shows an exec the test ran, with its
// exit code, on the activity timeline; the browser terminal runs a command
// and shows its output; the files browser lists a file and uploads one.
func TestConsoleSandbox(t *testing.T) {
	s := startServer(t)
	id := s.create()
	if out, code := s.run("exec", id, "--", "sh", "-c", "echo console-probe; exit 7"); code != 7 {
		t.Fatalf("exec exit %d, want 7: %s", code, out)
	}
	s.must("exec", id, "--", "sh", "-c", "echo hi > /tmp/from-test.txt")

	b := startBrowser(t, s)
	b.signIn(s.key)
	b.open("#/sandbox/" + id)
	b.waitText("#facts", "tiny")
	got := b.waitText(`#activity`, `echo console-probe; exit 7 → exit code 7`)
	t.Logf("activity: %s", got)

	// Files: list /tmp, see the file, upload one through the file input.
	b.run(chromedp.SetValue(chromedp.CSS("#files-path"), "/tmp"),
		chromedp.Click(chromedp.CSS("#files-path + button")))
	b.waitText("#files-list", "from-test.txt")
	up := t.TempDir() + "/uploaded.txt"
	writeFile(t, up, "uploaded-from-browser\n")
	b.run(chromedp.SetUploadFiles(chromedp.CSS("#files-upload"), []string{up}),
		chromedp.Click(chromedp.CSS("#files-upload + button")))
	b.waitText("#files-list", "uploaded.txt")
	if out := s.must("exec", id, "--", "cat", "/tmp/uploaded.txt"); out != "uploaded-from-browser" {
		t.Errorf("uploaded file holds %q", out)
	}
	b.screenshots("sandbox")

	// The terminal: a shell with a PTY; type a command, see its output.
	b.run(chromedp.Click(chromedp.CSS("#term-open")))
	b.waitText("#term-status", "connected")
	b.run(chromedp.SendKeys(chromedp.CSS("pre.term"), "echo hello-$RANDOM\r"))
	out := b.waitText("pre.term", `hello-[0-9]+`)
	if m := regexp.MustCompile(`hello-[0-9]+`).FindString(out); m == "" {
		t.Fatalf("terminal shows no output: %q", out)
	}
	b.run(chromedp.SendKeys(chromedp.CSS("pre.term"), "printf '\\033[1;31mred\\033[0m|%s\\n' \"$TERM\"\r"))
	b.waitText("pre.term", `red\|xterm-256color`)
	var color string
	b.eval(`[...document.querySelectorAll("pre.term span")].filter(s => s.textContent === "red").map(s => s.style.color)[0] || ""`, &color)
	if color == "" {
		t.Errorf("SGR 31 output has no colour")
	}
	b.screenshots("sandbox-terminal")

	// The shell shows up on the timeline too once it ends (exit).
	b.run(chromedp.SendKeys(chromedp.CSS("pre.term"), "exit 0\r"))
	b.waitText("#term-status", "ended")
	b.waitText("#activity", `-c if command -v bash`)
}

// TestConsoleTenant: another owner's session sees nothing of the sandbox in
// the UI and gets nothing from the JSON behind it; a write with the session
// cookie but without the CSRF header is refused, from the console's own page
// and from a page on another origin of the same site (where SameSite=Strict
// still sends the cookie).
func TestConsoleTenant(t *testing.T) {
	s := startServer(t)
	alice := s.must("key", "create", "--owner", "alice")
	bob := s.must("key", "create", "--owner", "bob")
	aliceBox := strings.TrimSpace(mustAs(t, s, alice, "create", "--template", "tiny"))
	bobBox := strings.TrimSpace(mustAs(t, s, bob, "create", "--template", "tiny"))

	b := startBrowser(t, s)
	b.signIn(bob)
	b.waitText("#sandboxes", bobBox)
	if got := b.text("#sandboxes"); strings.Contains(got, aliceBox) {
		t.Fatalf("bob's fleet lists alice's sandbox %s", aliceBox)
	}
	b.open("#/sandbox/" + aliceBox)
	b.waitText("main", "not found|no sandbox")
	b.screenshots("tenant-denied")
	csrf := b.csrf()
	if csrf == "" {
		t.Fatal("no CSRF token from /ui/session")
	}
	hdr := map[string]string{"X-Berth-CSRF": csrf, "Content-Type": "application/json"}
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + aliceBox, ""},
		{"GET", "/v1/sandboxes/" + aliceBox + "/activity", ""},
		{"GET", "/v1/sandboxes/" + aliceBox + "/events", ""},
		{"POST", "/v1/sandboxes/" + aliceBox + "/pause", "{}"},
		{"POST", "/v1/sandboxes/" + aliceBox + "/exec", `{"cmd":["true"]}`},
		{"POST", "/v1/sandboxes/" + aliceBox + "/fs/list", `{"path":"/"}`},
		{"GET", "/v1/sandboxes/" + aliceBox + "/files?path=/etc/hostname", ""},
		{"DELETE", "/v1/sandboxes/" + aliceBox, ""},
	} {
		code, body := b.fetch(req.method, req.path, req.body, hdr)
		if strings.HasSuffix(req.path, "/events") && code == http.StatusOK && strings.TrimSpace(body) == "[]" {
			continue // events are filtered by owner: another's are simply not there
		}
		if code != http.StatusNotFound && code != http.StatusForbidden {
			t.Errorf("bob's session: %s %s = %d %s, want 404/403", req.method, req.path, code, body)
		}
		if strings.Contains(body, aliceBox) && req.method == "GET" && strings.Contains(body, `"owner"`) {
			t.Errorf("bob's session: %s %s leaks alice's sandbox: %s", req.method, req.path, body)
		}
	}
	code, body := b.fetch("GET", "/v1/events", "", nil)
	if code != 200 || strings.Contains(body, aliceBox) {
		t.Errorf("bob's /v1/events = %d, shows alice's sandbox: %v", code, strings.Contains(body, aliceBox))
	}

	// Alice, signed in, is the victim of the forged writes.
	b.run(chromedp.Click(chromedp.CSS("#signout")))
	b.waitText("#signin", "API key")
	b.signIn(alice)
	b.waitText("#sandboxes", aliceBox)
	if code, body := b.fetch("POST", "/v1/sandboxes/"+aliceBox+"/pause", "{}", map[string]string{"Content-Type": "application/json"}); code != http.StatusForbidden {
		t.Errorf("cookie POST without the CSRF header = %d %s, want 403", code, body)
	}
	if code, body := b.fetch("POST", "/v1/sandboxes/"+aliceBox+"/pause", "{}", map[string]string{"X-Berth-CSRF": "forged-" + csrf}); code != http.StatusForbidden {
		t.Errorf("cookie POST with another session's CSRF token = %d %s, want 403", code, body)
	}

	// A page on another port of the same host: same site, other origin. It
	// fires a form POST and a no-cors fetch at the API with alice's cookie.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><body>
<form id="f" method="POST" action="%[1]s/v1/sandboxes/%[2]s/pause" enctype="text/plain"><input name='{"a":"' value='"}'></form>
<script>
fetch("%[1]s/v1/sandboxes/%[2]s/exec", {method: "POST", mode: "no-cors", credentials: "include",
  headers: {"Content-Type": "text/plain"}, body: '{"cmd":["sh","-c","echo pwned > /tmp/pwned"]}'})
  .finally(() => { document.title = "fetched"; document.getElementById("f").submit(); });
</script></body>`, s.url, aliceBox)
	}))
	defer evil.Close()
	b.run(chromedp.Navigate(evil.URL))
	var loc string
	testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
		b.eval(`location.href`, &loc)
		if !strings.HasPrefix(loc, s.url) {
			return fmt.Errorf("form not submitted yet (at %s)", loc)
		}
		return nil
	})
	if body := b.text("body"); !strings.Contains(body, "cross-origin") && !strings.Contains(body, "X-Berth-CSRF") {
		t.Errorf("the forged form POST was not refused by the console's check: %s", body)
	}
	if st := stateOf(t, s, aliceBox); st != "running" {
		t.Fatalf("alice's sandbox is %s after the forged pause, want running", st)
	}
	if out, code := s.runAs(alice, nil, "exec", aliceBox, "--", "cat", "/tmp/pwned"); code == 0 {
		t.Fatalf("the forged exec ran in alice's sandbox: %s", out)
	}

	// Positive control: the console's own write, with the header, acts.
	b.open("#/fleet")
	b.waitText("#sandboxes", aliceBox)
	if code, body := b.fetch("POST", "/v1/sandboxes/"+aliceBox+"/pause", "{}",
		map[string]string{"X-Berth-CSRF": b.csrf(), "Content-Type": "application/json"}); code != 200 {
		t.Fatalf("the console's own pause = %d %s", code, body)
	}
	if st := stateOf(t, s, aliceBox); st != "paused" {
		t.Fatalf("alice's sandbox is %s after her own pause", st)
	}
}

func mustAs(t *testing.T, s *server, key string, args ...string) string {
	t.Helper()
	out, code := s.runAs(key, nil, args...)
	if code != 0 {
		t.Fatalf("berth %v: exit %d: %s", args, code, out)
	}
	return out
}

func stateOf(t *testing.T, s *server, id string) string {
	t.Helper()
	code, body := s.api(s.key, "GET", "/v1/sandboxes/"+id, nil)
	if code != 200 {
		t.Fatalf("GET sandbox %s: %d %v", id, code, body)
	}
	st, _ := body["state"].(string)
	return st
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleHostileSandbox: what a sandbox writes reaches the page as
// text. Root inside a real sandbox (runc and runsc) names a file with
// markup, runs a command whose argv is markup and prints terminal escapes
// (an OSC title, a cursor jump far off-screen); the console lists them
// literally and none of it runs as script in the console's origin.
func TestConsoleHostileSandbox(t *testing.T) {
	s := startServer(t, "--runtime", "runc")
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			const mark = `<img src=x onerror="window.__pwned=1">`
			s.must("exec", "--user", "root", id, "--", "sh", "-c", `touch "/tmp/$1"; mkdir -p "/tmp/<svg onload=window.__pwned=2>"`, "sh", mark)
			if _, code := s.run("exec", "--user", "root", id, "--", "sh", "-c", "exit 0", "<script>window.__pwned=3</script>"); code != 0 {
				t.Fatalf("exec: %d", code)
			}
			b := startBrowser(t, s)
			b.signIn(s.key)
			b.open("#/sandbox/" + id)
			b.waitText("#activity", regexp.QuoteMeta("<script>window.__pwned=3</script>"))
			b.run(chromedp.SetValue(chromedp.CSS("#files-path"), "/tmp"),
				chromedp.Click(chromedp.CSS("#files-path + button")))
			b.waitText("#files-list", regexp.QuoteMeta(mark))
			b.waitText("#files-list", regexp.QuoteMeta("<svg onload=window.__pwned=2>/"))

			b.run(chromedp.Click(chromedp.CSS("#term-open")))
			b.waitText("#term-status", "connected")
			b.run(chromedp.SendKeys(chromedp.CSS("pre.term"),
				`printf '\033]0;<img src=x onerror=window.__pwned=4>\007\033[99999;99999H\033[99999Aafter-jump\n'`+"\r"))
			b.waitText("pre.term", `jump`) // where the bounded cursor put it
			var pwned any
			b.eval(`window.__pwned === undefined ? null : window.__pwned`, &pwned)
			if pwned != nil {
				t.Fatalf("sandbox content ran as script in the console (window.__pwned = %v)", pwned)
			}
			var imgs int
			b.eval(`document.querySelectorAll("main img, main svg, main script").length`, &imgs)
			if imgs != 0 {
				t.Errorf("sandbox content became %d elements in the page", imgs)
			}
			b.screenshots("hostile-" + rt)
		})
	}
}

// TestConsoleActions: the sandbox page's buttons act only after their
// confirmation, and what they did is what the API then reports.
func TestConsoleActions(t *testing.T) {
	s := startServer(t)
	id := s.create()
	b := startBrowser(t, s)
	b.signIn(s.key)
	b.open("#/sandbox/" + id)
	b.waitText("#sb-state", "running")

	confirm := func(button string, ok bool) {
		t.Helper()
		b.run(chromedp.Click(chromedp.CSS(button)))
		b.waitText("#confirm-text", `\S`)
		var open bool
		b.eval(`document.querySelector("#confirm").open`, &open)
		if !open {
			t.Fatalf("%s: no confirmation dialog", button)
		}
		if ok {
			b.run(chromedp.Click(chromedp.CSS("#confirm-ok")))
		} else {
			b.run(chromedp.Click(chromedp.CSS("#confirm-cancel")))
		}
		b.run(chromedp.WaitNotVisible(chromedp.CSS("#confirm")))
	}
	// Cancelled with the default mode: had it been sent, the sandbox would
	// be paused in the default mode and the disk pause below would fail.
	confirm("#act-pause", false)
	b.run(chromedp.SetValue(chromedp.CSS("#pause-mode"), "disk"))
	confirm("#act-pause", true)
	b.waitText("#sb-state", "paused")
	if code, body := s.api(s.key, "GET", "/v1/sandboxes/"+id, nil); code != 200 || body["state"] != "paused" || body["pause_mode_requested"] != "disk" {
		t.Fatalf("after Pause (disk) the API says %d %v %v", code, body["state"], body["pause_mode_requested"])
	}
	b.waitText("#facts", "Pause mode\\s+disk")
	confirm("#act-resume", true)
	b.waitText("#sb-state", "running")
	confirm("#act-snapshot", true)
	b.waitText("#toast", "snapshot ")
	confirm("#act-fork", true)
	b.waitText("#toast", "forked: ")
	child := strings.TrimPrefix(strings.TrimSpace(b.text("#toast")), "forked: ")
	if st := stateOf(t, s, child); st != "running" {
		t.Errorf("fork child %s is %s", child, st)
	}
	b.screenshots("sandbox-actions")
	confirm("#act-delete", true)
	b.waitText("main h1", "Fleet")
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		if code, body := s.api(s.key, "GET", "/v1/sandboxes/"+id, nil); code != http.StatusNotFound {
			return fmt.Errorf("after Delete GET sandbox = %d %v, want 404", code, body["state"])
		}
		return nil
	})
}
