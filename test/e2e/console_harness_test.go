package e2e

// The browser harness of the console tests: a headless Chromium (Debian's
// chromium package, driven over the DevTools protocol by chromedp) pointed
// at a real `berth serve` from startServer. Other console tests reuse it:
// startBrowser, signIn, open, waitText, eval, screenshots.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/testutil"
)

// browser is one headless Chromium tab on one berth server.
type browser struct {
	t   *testing.T
	s   *server
	ctx context.Context
}

// The page sizes every screenshot is taken at: a laptop and a phone.
var consoleSizes = []struct {
	name string
	w, h int64
	mob  bool
}{{"desktop", 1280, 800, false}, {"phone", 390, 844, true}}

// startBrowser starts Chromium for s. Without chromium it skips, or fails
// with CI=true.
func startBrowser(t *testing.T, s *server) *browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		testutil.Missing(t, "chromium is not installed (scripts/setup.sh installs Debian's chromium)")
	}
	dir := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dir),
		chromedp.NoSandbox, // tests run as root, where Chromium's own sandbox refuses to start
		chromedp.Flag("disable-gpu", true),
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("lang", "en-US"),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancel(); acancel() })
	b := &browser{t: t, s: s, ctx: ctx}
	// The first action starts the browser, on a context with no timeout:
	// the browser lives as long as the context of that first call.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// run runs actions with a bound, failing the test on error.
func (b *browser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// open loads the console at a route, e.g. "#/fleet".
func (b *browser) open(hash string) {
	b.t.Helper()
	b.run(chromedp.Navigate(b.s.url + "/ui/" + hash))
}

// eval evaluates a JS expression in the page (awaiting a promise) into out.
func (b *browser) eval(js string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("browser: eval %.80q: %v", js, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		b.t.Fatalf("browser: eval %.80q: result %.200s: %v", js, raw, err)
	}
}

// text is the rendered text (innerText: lines as shown) of the first
// element matching sel ("" if none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	b.eval(fmt.Sprintf(`(document.querySelector(%q)||{}).innerText||""`, sel), &s)
	return s
}

// waitText waits until sel's text matches re.
func (b *browser) waitText(sel, re string) string {
	b.t.Helper()
	rx := regexp.MustCompile(re)
	var got string
	testutil.Eventually(b.t, testutil.Within(45*time.Second).Every(200*time.Millisecond), func() error {
		got = b.text(sel)
		if !rx.MatchString(got) {
			return fmt.Errorf("%s: text %q does not match %q", sel, got, re)
		}
		return nil
	})
	return got
}

// signIn signs in through the sign-in form with key and waits for the fleet.
func (b *browser) signIn(key string) {
	b.t.Helper()
	b.open("#/fleet")
	b.run(
		chromedp.WaitVisible(chromedp.CSS("#api-key")),
		chromedp.SendKeys(chromedp.CSS("#api-key"), key),
		chromedp.Click(chromedp.CSS("#signin button[type=submit]")),
	)
	b.waitText("#who", `\S`)
}

// fetch calls the API from inside the page (so with the session cookie and
// the page's origin) and returns the status and body.
func (b *browser) fetch(method, path, body string, headers map[string]string) (int, string) {
	b.t.Helper()
	if headers == nil {
		headers = map[string]string{}
	}
	h, _ := json.Marshal(headers)
	var out struct {
		Status int
		Body   string
	}
	js := fmt.Sprintf(`(async () => { const r = await fetch(%q, {method: %q, headers: %s, body: %s, credentials: "same-origin"});
		return {Status: r.status, Body: await r.text()}; })()`, path, method, h, jsBody(body))
	b.eval(js, &out)
	return out.Status, out.Body
}

func jsBody(body string) string {
	if body == "" {
		return "undefined"
	}
	q, _ := json.Marshal(body)
	return string(q)
}

// csrf is the session's CSRF token, as the console learns it.
func (b *browser) csrf() string {
	b.t.Helper()
	_, body := b.fetch("GET", "/ui/session", "", nil)
	var se struct{ CSRF string }
	_ = json.Unmarshal([]byte(body), &se)
	return se.CSRF
}

// artifactsDir is where screenshots go: $BERTH_ARTIFACTS, else ./artifacts
// at the repo root (gitignored); scripts/test.sh keeps it.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BERTH_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "artifacts")
	}
	dir = filepath.Join(dir, "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// screenshots saves the current page at both sizes as <name>-<size>.png and
// checks that at each the page has no horizontal overflow (the console works
// at a phone's width without sideways scrolling of the page itself).
func (b *browser) screenshots(name string) {
	b.t.Helper()
	dir := artifactsDir(b.t)
	for _, sz := range consoleSizes {
		opts := []chromedp.EmulateViewportOption{chromedp.EmulateScale(1)}
		if sz.mob {
			opts = append(opts, chromedp.EmulateMobile)
		}
		b.run(chromedp.EmulateViewport(sz.w, sz.h, opts...), chromedp.Sleep(300*time.Millisecond))
		var over int
		// Against the emulated width, not innerWidth: a mobile viewport
		// zooms out to fit an overflowing page, hiding the overflow.
		b.eval(fmt.Sprintf(`document.documentElement.scrollWidth - %d`, sz.w), &over)
		if over > 1 {
			b.t.Errorf("%s at %s (%dx%d): the page is %d px wider than the viewport", name, sz.name, sz.w, sz.h, over)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			b.t.Fatalf("screenshot %s: %v", name, err)
		}
		file := filepath.Join(dir, fmt.Sprintf("%s-%s.png", strings.ReplaceAll(name, "/", "-"), sz.name))
		if err := os.WriteFile(file, png, 0o644); err != nil {
			b.t.Fatal(err)
		}
		b.t.Logf("screenshot %s", file)
	}
	b.run(chromedp.EmulateViewport(1280, 800))
	b.checkLabels(name)
}

// checkLabels fails for a form control or button on the page that a screen
// reader could not name, or a control that the keyboard cannot reach.
func (b *browser) checkLabels(page string) {
	b.t.Helper()
	var bad []string
	b.eval(`[...document.querySelectorAll("input, select, textarea, button, a[href], pre.term")]
		.filter(el => el.offsetParent !== null || el === document.activeElement)
		.filter(el => {
			const name = (el.labels && el.labels.length ? [...el.labels].map(l => l.textContent).join("") : "") ||
				el.getAttribute("aria-label") || (el.tagName === "BUTTON" || el.tagName === "A" ? el.textContent : "");
			return !name.trim() || el.tabIndex < 0;
		}).map(el => el.outerHTML.slice(0, 120))`, &bad)
	for _, el := range bad {
		b.t.Errorf("%s: control without an accessible name or out of the tab order: %s", page, el)
	}
}
