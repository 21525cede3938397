package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/testutil"
)

// evalInBrowser loads the console's assets into headless Chromium (no berth
// server, no root) and evaluates js there. term.js is pure DOM-free logic
// for the Screen; the browser is just its JavaScript engine.
func evalInBrowser(t *testing.T, js string) json.RawMessage {
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
	srv := httptest.NewServer(New(keys{}, Config{}).Handler())
	t.Cleanup(srv.Close)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox, chromedp.Flag("disable-gpu", true))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ui/")); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 60*time.Second)
	defer tcancel()
	raw, err := chromedp.Run(tctx, chromedp.Evaluate[[]byte](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("eval: %v", err)
	}
	return raw
}

func TestScreen(t *testing.T) {
	type tc struct {
		Name   string   `json:"name"`
		Cols   int      `json:"cols"`
		Rows   int      `json:"rows"`
		In     string   `json:"in"`
		Want   []string `json:"want"`             // screen rows, trailing blanks trimmed
		Cursor []int    `json:"cursor,omitempty"` // x, y after
		Back   []string `json:"back,omitempty"`   // lines scrolled off
		Reply  string   `json:"reply,omitempty"`  // what the screen answered
	}
	cases := []tc{
		{Name: "text and CRLF", Cols: 10, Rows: 3, In: "ab\r\ncd", Want: []string{"ab", "cd", ""}, Cursor: []int{2, 1}},
		{Name: "LF keeps the column", Cols: 10, Rows: 3, In: "ab\ncd", Want: []string{"ab", "  cd", ""}},
		{Name: "backspace", Cols: 10, Rows: 2, In: "abc\bX", Want: []string{"abX", ""}},
		{Name: "backspace stops at column 0", Cols: 10, Rows: 2, In: "\b\bX", Want: []string{"X", ""}},
		{Name: "tab", Cols: 20, Rows: 1, In: "a\tb", Want: []string{"a       b"}},
		{Name: "wrap", Cols: 5, Rows: 3, In: "0123456", Want: []string{"01234", "56", ""}},
		{Name: "deferred wrap then CRLF adds no blank line", Cols: 5, Rows: 3, In: "01234\r\nx", Want: []string{"01234", "x", ""}},
		{Name: "cursor left and overwrite", Cols: 10, Rows: 1, In: "abc\x1b[2DX", Want: []string{"aXc"}},
		{Name: "cursor position", Cols: 10, Rows: 3, In: "\x1b[2;3HX", Want: []string{"", "  X", ""}},
		{Name: "positions are bounded", Cols: 4, Rows: 2, In: "\x1b[99999;99999HX\x1b[99999A\x1b[99999DY", Want: []string{"Y", "   X"}},
		{Name: "erase to end of line", Cols: 10, Rows: 1, In: "abcdef\x1b[3G\x1b[K", Want: []string{"ab"}},
		{Name: "erase to start of line", Cols: 10, Rows: 1, In: "abcdef\x1b[3G\x1b[1K", Want: []string{"   def"}},
		{Name: "erase display", Cols: 5, Rows: 2, In: "abc\r\ndef\x1b[2J", Want: []string{"", ""}},
		{Name: "erase below", Cols: 5, Rows: 3, In: "aaa\r\nbbb\r\nccc\x1b[2;2H\x1b[J", Want: []string{"aaa", "b", ""}},
		{Name: "scroll into scrollback", Cols: 5, Rows: 3, In: "1\r\n2\r\n3\r\n4", Want: []string{"2", "3", "4"}, Back: []string{"1"}},
		{Name: "delete chars", Cols: 6, Rows: 1, In: "abcd\x1b[1G\x1b[2P", Want: []string{"cd"}},
		{Name: "insert chars", Cols: 6, Rows: 1, In: "abcd\x1b[1G\x1b[2@", Want: []string{"  abcd"}},
		{Name: "insert line", Cols: 5, Rows: 3, In: "a\r\nb\r\nc\x1b[2H\x1b[L", Want: []string{"a", "", "b"}},
		{Name: "delete line", Cols: 5, Rows: 3, In: "a\r\nb\r\nc\x1b[1H\x1b[M", Want: []string{"b", "c", ""}},
		{Name: "scroll region", Cols: 5, Rows: 4, In: "top\x1b[2;3r\x1b[3H1\r\n2\r\n3", Want: []string{"top", "2", "3", ""}},
		{Name: "alternate screen restores the main one", Cols: 8, Rows: 2, In: "main\x1b[?1049hALT\x1b[2J\x1b[?1049l", Want: []string{"main", ""}, Cursor: []int{4, 0}},
		{Name: "OSC title is dropped", Cols: 10, Rows: 1, In: "\x1b]0;<b>title</b>\x07ok\x1b]2;x\x1b\\!", Want: []string{"ok!"}},
		{Name: "charset selection is dropped", Cols: 10, Rows: 1, In: "\x1b(Bok", Want: []string{"ok"}},
		{Name: "SGR does not print", Cols: 10, Rows: 1, In: "\x1b[1;31;48;5;200mR\x1b[0mN\x1b[38;2;1;2;3mT", Want: []string{"RNT"}},
		{Name: "unicode", Cols: 10, Rows: 1, In: "héllo ✓", Want: []string{"héllo ✓"}},
		{Name: "cursor report", Cols: 10, Rows: 3, In: "ab\r\nc\x1b[6n", Want: []string{"ab", "c", ""}, Reply: "\x1b[2;2R"},
		{Name: "save and restore cursor", Cols: 10, Rows: 2, In: "ab\x1b7\r\nxyz\x1b8C", Want: []string{"abC", "xyz"}},
		{Name: "overlong parameters are bounded", Cols: 10, Rows: 1, In: "\x1b[" + strings.Repeat("1;", 500) + "mok", Want: []string{"ok"}},
	}
	in, _ := json.Marshal(cases)
	js := fmt.Sprintf(`(async () => {
		const m = await import("/ui/term.js");
		return %s.map((c) => {
			const back = [];
			let reply = "";
			const s = new m.Screen(c.cols, c.rows, {onReply: (r) => { reply += r; }, onScroll: (l) => back.push(l.map((x) => x.c).join("").trimEnd())});
			s.write(c.in);
			return {name: c.name, cols: c.cols, rows: c.rows, in: c.in,
				want: s.lines().map((r) => r.map((x) => x.c).join("").trimEnd()),
				cursor: c.cursor ? [s.x, s.y] : undefined, back: back.length ? back : undefined, reply: reply || undefined};
		});
	})()`, in)
	var got []tc
	if err := json.Unmarshal(evalInBrowser(t, js), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("%d results for %d cases", len(got), len(cases))
	}
	for i, want := range cases {
		t.Run(want.Name, func(t *testing.T) {
			if diff := cmp.Diff(want, got[i]); diff != "" {
				t.Errorf("input %q (-want +got):\n%s", want.In, diff)
			}
		})
	}
}

func TestKeyBytes(t *testing.T) {
	type key struct {
		Key   string `json:"key"`
		Ctrl  bool   `json:"ctrlKey,omitempty"`
		Alt   bool   `json:"altKey,omitempty"`
		Shift bool   `json:"shiftKey,omitempty"`
		App   bool   `json:"app,omitempty"`
	}
	cases := []struct {
		k    key
		want string
	}{
		{key{Key: "a"}, "a"}, {key{Key: "Enter"}, "\r"}, {key{Key: "Backspace"}, "\x7f"}, {key{Key: "Tab"}, "\t"},
		{key{Key: "Tab", Shift: true}, ""}, // leaves the terminal
		{key{Key: "c", Ctrl: true}, "\x03"}, {key{Key: "D", Ctrl: true}, "\x04"}, {key{Key: "[", Ctrl: true}, "\x1b"},
		{key{Key: "ArrowUp"}, "\x1b[A"}, {key{Key: "ArrowUp", App: true}, "\x1bOA"}, {key{Key: "Delete"}, "\x1b[3~"},
		{key{Key: "x", Alt: true}, "\x1bx"}, {key{Key: "C", Ctrl: true, Shift: true}, ""}, {key{Key: "Shift"}, ""},
	}
	var keys []key
	for _, c := range cases {
		keys = append(keys, c.k)
	}
	in, _ := json.Marshal(keys)
	var got []string
	if err := json.Unmarshal(evalInBrowser(t, fmt.Sprintf(`(async () => {
		const m = await import("/ui/term.js");
		return %s.map((k) => m.keyBytes({ctrlKey: false, altKey: false, shiftKey: false, metaKey: false, isComposing: false, ...k}, !!k.app));
	})()`, in)), &got); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		if got[i] != c.want {
			t.Errorf("%+v: got %q, want %q", c.k, got[i], c.want)
		}
	}
}
