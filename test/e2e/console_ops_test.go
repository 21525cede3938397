package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/testutil"
)

// opsKey creates an API key for owner.
func (s *server) opsKey(owner string) string {
	s.t.Helper()
	code, body := s.api(s.key, "POST", "/v1/keys", map[string]any{"owner": owner})
	if code != http.StatusCreated {
		s.t.Fatalf("key for %s: %d %v", owner, code, body)
	}
	return body["key"].(string)
}

// opsCreate creates a tiny sandbox with key.
func (s *server) opsCreate(key string) string {
	s.t.Helper()
	code, body := s.api(key, "POST", "/v1/sandboxes", map[string]any{"template": "tiny"})
	if code != http.StatusCreated {
		s.t.Fatalf("create: %d %v", code, body)
	}
	return body["id"].(string)
}

// opsGet GETs path with key into out and returns the status.
func (s *server) opsGet(key, path string, out any) int {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

type opsSeries struct {
	By      string      `json:"by"`
	Buckets []time.Time `json:"buckets"`
	Lines   []struct {
		Key           string    `json:"key"`
		Reserved      []float64 `json:"reserved"`
		Active        []float64 `json:"active"`
		TotalReserved float64   `json:"total_reserved"`
		TotalActive   float64   `json:"total_active"`
	} `json:"lines"`
}

func (s *server) opsSeriesKeys(key, query string) []string {
	s.t.Helper()
	var ser opsSeries
	if code := s.opsGet(key, "/v1/usage/series?"+query, &ser); code != http.StatusOK {
		s.t.Fatalf("series %s: %d", query, code)
	}
	var out []string
	for _, l := range ser.Lines {
		if l.TotalReserved > 0 && len(l.Reserved) == len(ser.Buckets) {
			out = append(out, l.Key)
		}
	}
	return out
}

// opsWaitSVGText waits for an SVG element's text (textContent: SVG elements
// have no innerText) to match re.
func opsWaitSVGText(b *browser, sel, re string) {
	b.t.Helper()
	rx := regexp.MustCompile(re)
	testutil.Eventually(b.t, testutil.Within(45*time.Second).Every(200*time.Millisecond), func() error {
		var got string
		b.eval(fmt.Sprintf(`(document.querySelector(%q)||{}).textContent||""`, sel), &got)
		if !rx.MatchString(got) {
			return fmt.Errorf("%s: text %q does not match %q", sel, got, re)
		}
		return nil
	})
}

// TestConsoleOps: the console's operator views and the REST behind them,
// on a server whose reaper (and so metering) runs every 500 ms.
//   - pools: a create claimed from a warm pool is a hit in the pools view;
//     the template's import is in the build history;
//   - cost: usage over time of two owners is charted for the admin, and an
//     owner sees only its own line (in the view and the JSON behind it);
//   - orphans: an owner's abandoned sandbox is listed with its cost per day
//     and cleaned up with one click and a confirmation; it is gone through
//     the API afterwards, while another owner's sandbox, which the owner
//     cannot clean up through the API either, is untouched.
func TestConsoleOps(t *testing.T) {
	s := startReaperServer(t)
	alice, bob := s.opsKey("alice"), s.opsKey("bob")
	s.must("pool", "set", "tiny", "--size", "1")
	t.Cleanup(func() {
		// Drain the pool before the harness checks that nothing is left.
		s.must("pool", "rm", "tiny")
		testutil.Eventually(t, testutil.Within(60*time.Second).Every(100*time.Millisecond), func() error {
			code, body := s.api(s.key, "GET", "/v1/sandboxes?owner=_pool", nil)
			if list, _ := body["sandboxes"].([]any); code != 200 || len(list) != 0 {
				return fmt.Errorf("pool members not drained: %v", body)
			}
			return nil
		})
	})
	s.waitPool("tiny", 1, "")
	aID := s.opsCreate(alice) // claimed from the pool
	bID := s.opsCreate(bob)
	if p := s.pool("tiny"); p.Hits < 1 {
		t.Fatalf("the first create was not a pool hit: %+v", p)
	}

	// REST: build history and series scoping.
	var builds struct {
		Builds []struct {
			Template, Kind, Result, Fingerprint string
			Ms                                  int64
		}
	}
	if code := s.opsGet(alice, "/v1/builds?template=tiny", &builds); code != http.StatusOK || len(builds.Builds) == 0 ||
		builds.Builds[0].Kind != "import" || builds.Builds[0].Result != "ready" || builds.Builds[0].Fingerprint == "" {
		t.Fatalf("build history of tiny: %d %+v", code, builds)
	}
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(500*time.Millisecond), func() error {
		if got := s.opsSeriesKeys(s.key, "by=owner"); !slices.Contains(got, "alice") || !slices.Contains(got, "bob") {
			return fmt.Errorf("admin's series has lines %v, want alice and bob", got)
		}
		return nil
	})
	for _, q := range []string{"by=owner", "by=owner&owner=bob", "by=template"} {
		got := s.opsSeriesKeys(alice, q)
		want := []string{"alice"}
		if strings.Contains(q, "template") {
			want = []string{"tiny"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("alice's series %s = %v, want %v", q, got, want)
		}
	}
	if code, body := s.api(alice, "GET", "/v1/usage/series?step=30m", nil); code != http.StatusBadRequest || body["field"] != "step" {
		t.Errorf("step=30m: %d %v, want 400 naming step", code, body)
	}
	// REST: a clean-up deletes only the caller's current orphans.
	code, body := s.api(alice, "POST", "/v1/reports/orphans/cleanup", map[string]any{"days": 0, "sandboxes": []string{bID}})
	if code != http.StatusOK || len(body["deleted"].([]any)) != 0 || !strings.Contains(fmt.Sprint(body["refused"]), "404") {
		t.Errorf("alice cleaning up bob's sandbox: %d %v", code, body)
	}
	code, body = s.api(alice, "POST", "/v1/reports/orphans/cleanup", map[string]any{"days": 7, "sandboxes": []string{aID}})
	if code != http.StatusOK || len(body["deleted"].([]any)) != 0 || !strings.Contains(fmt.Sprint(body["refused"]), "not an orphan") {
		t.Errorf("cleaning up a sandbox used today as a 7-day orphan: %d %v", code, body)
	}
	// The same through the CLI.
	if out := s.must("builds", "tiny"); !strings.Contains(out, "import") || !strings.Contains(out, "ready") {
		t.Errorf("berth builds tiny:\n%s", out)
	}
	if out := s.must("cost", "--by", "template"); !strings.Contains(out, "tiny") {
		t.Errorf("berth cost --by template:\n%s", out)
	}
	if out, code := s.run("cleanup", "--days", "7", aID); code != 4 || !strings.Contains(out, "not an orphan") {
		t.Errorf("berth cleanup --days 7 of a fresh sandbox: exit %d: %s", code, out)
	}
	for _, id := range []string{aID, bID} {
		if code := s.opsGet(s.key, "/v1/sandboxes/"+id, nil); code != http.StatusOK {
			t.Fatalf("sandbox %s after refused clean-ups: %d", id, code)
		}
	}

	b := startBrowser(t, s)
	b.signIn(s.key)

	// Pools and templates.
	b.open("#/pools")
	b.waitText(`#pools tr[data-template="tiny"] .hits`, `^[1-9]\d*$`)
	b.waitText(`#pools tr[data-template="tiny"] .hit-rate`, `^\d+%$`)
	b.waitText(`#builds tr[data-template="tiny"] .result`, `ready`)
	b.waitText(`#templates tr[data-template="tiny"]`, `ready in`)
	b.screenshots("pools")

	// Cost, as the admin: both owners' lines, on both bases.
	b.open("#/cost/owner/reserved/24h")
	b.waitText("#cost-legend", `alice`)
	b.waitText("#cost-legend", `bob`)
	var series int
	b.eval(`document.querySelectorAll('#cost-chart g.series').length`, &series)
	if series < 2 {
		t.Errorf("admin's chart has %d lines, want at least 2", series)
	}
	opsWaitSVGText(b, "#cost-chart-title", `reserved basis`)
	b.waitText(`#cost-totals tr[data-key="bob"] .total-reserved`, `^[0-9.]+$`)
	b.screenshots("cost")
	b.run(chromedp.Click(chromedp.CSS("#c-basis-active")))
	opsWaitSVGText(b, "#cost-chart-title", `active basis`)

	// Cost, as alice: her line only.
	b.run(chromedp.Click(chromedp.CSS("#signout")))
	b.signIn(alice)
	b.open("#/cost/owner/reserved/24h")
	b.waitText("#cost-legend", `alice`)
	if legend := b.text("#cost-legend"); strings.Contains(legend, "bob") {
		t.Errorf("alice's cost chart shows bob: %q", legend)
	}
	b.eval(`document.querySelectorAll('#cost-chart g.series').length`, &series)
	if series != 1 {
		t.Errorf("alice's chart has %d lines, want 1", series)
	}
	b.screenshots("cost-owner")

	// Orphans, as alice: her sandbox with its cost per day, not bob's;
	// one click and a confirmation delete it.
	b.open("#/orphans/0")
	row := `#orphans tr[data-kind="sandbox"][data-id="` + aID + `"]`
	b.waitText(row+" .per-day-reserved", `^[0-9.]+$`)
	if strings.Contains(b.text("#orphans"), bID) {
		t.Errorf("alice's orphans list bob's sandbox %s", bID)
	}
	b.waitText("#orphans-summary", `cost [0-9.]+ \S* ?per day reserved`)
	b.screenshots("orphans")
	b.run(chromedp.Click(chromedp.CSS(row + " button.cleanup")))
	var open bool
	testutil.Eventually(t, testutil.Within(10*time.Second).Every(100*time.Millisecond), func() error {
		b.eval(`document.getElementById('confirm').open`, &open)
		if !open {
			return fmt.Errorf("no confirmation dialog")
		}
		return nil
	})
	if txt := b.text("#confirm-text"); !strings.Contains(txt, aID) || !strings.Contains(txt, "per day") {
		t.Errorf("confirmation text %q does not name the sandbox and its cost", txt)
	}
	b.run(chromedp.Click(chromedp.CSS("#confirm-ok")))
	testutil.Eventually(t, testutil.Within(30*time.Second).Every(200*time.Millisecond), func() error {
		if code := s.opsGet(s.key, "/v1/sandboxes/"+aID, nil); code != http.StatusNotFound {
			return fmt.Errorf("sandbox %s after the clean-up: %d, want 404", aID, code)
		}
		return nil
	})
	testutil.Eventually(t, testutil.Within(15*time.Second).Every(200*time.Millisecond), func() error {
		var n int
		b.eval(fmt.Sprintf(`document.querySelectorAll(%q).length`, row), &n)
		if n != 0 {
			return fmt.Errorf("the cleaned-up sandbox is still listed")
		}
		return nil
	})
	if code := s.opsGet(s.key, "/v1/sandboxes/"+bID, nil); code != http.StatusOK {
		t.Errorf("bob's sandbox after alice's clean-up: %d, want 200", code)
	}
}
