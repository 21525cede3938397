package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/sandbox"
)

func viewsOf(n int) []*sandbox.Sandbox {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var list []*sandbox.Sandbox
	for i := range n {
		list = append(list, &sandbox.Sandbox{ID: fmt.Sprintf("sb%018d", i), Owner: "admin", Template: "tiny", TemplateID: "7656a6f3e0d28efce5295b56c545e20e",
			Runtime: "runc", State: sandbox.Running, Reason: "created", Labels: map[string]string{},
			Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024},
			CreatedAt: t0.Add(time.Duration(i) * time.Millisecond), StartedAt: t0, ExpiresAt: t0.Add(3 * time.Hour), ExpiryAction: sandbox.ExpireStop,
			Attrs: sandbox.Attrs{Layers: []string{"b7b4270bf694b5183b5c8c1bffcc024cf537fa1738b956a6160cccf1bf2ca4ac"},
				Net: sandbox.NetState{Policy: []byte(`{"mode":"deny-all"}`)}, UserNS: "2000000000:65536"}})
	}
	return list
}

// TestWriteListCompactsLargePages: a page of more than compactOver items is
// compact, a smaller one indented; both carry the same list.
func TestWriteListCompactsLargePages(t *testing.T) {
	for _, n := range []int{3, compactOver, compactOver + 1, 1000} {
		want := ListResponse{Sandboxes: sandboxViews(viewsOf(n)), Next: "c"}
		w := httptest.NewRecorder()
		writeList(w, n, want)
		body := w.Body.Bytes()
		if indented := bytes.Contains(body, []byte("\n  ")); indented != (n <= compactOver) {
			t.Errorf("%d items: indented %v, want %v", n, indented, n <= compactOver)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%d items: Content-Type %q", n, ct)
		}
		var got ListResponse
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%d items: %v", n, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%d items: decoded page differs (-want +got):\n%s", n, diff)
		}
	}
}

// BenchmarkListView: a page of 1,000 sandboxes from store rows to the
// client's decoded list: the views, the encoding (indented and compact)
// and a client's decode of each.
func BenchmarkListView(b *testing.B) {
	list := viewsOf(1000)
	b.Run("views", func(b *testing.B) {
		for b.Loop() {
			_ = sandboxViews(list)
		}
	})
	for _, indent := range []bool{true, false} {
		n := 1000
		if indent {
			n = 1 // writeList indents small pages
		}
		name := map[bool]string{true: "indented", false: "compact"}[indent]
		var body []byte
		b.Run("encode/"+name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				writeList(w, n, ListResponse{Sandboxes: sandboxViews(list)})
				body = w.Body.Bytes()
			}
			b.ReportMetric(float64(len(body)), "bytes")
		})
		b.Run("decode/"+name, func(b *testing.B) {
			for b.Loop() {
				var out ListResponse
				if err := json.Unmarshal(body, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
