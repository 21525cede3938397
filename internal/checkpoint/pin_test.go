package checkpoint

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

func TestWithPinnedLayers(t *testing.T) {
	tpl := &store.Template{Name: "t", Layers: []string{"top", "base"}}
	for _, c := range []struct {
		name string
		in   sandbox.Attrs
		tpl  *store.Template
		want sandbox.Attrs
	}{
		{"template layers pinned", sandbox.Attrs{}, tpl, sandbox.Attrs{Layers: []string{"top", "base"}}},
		{"other attrs kept", sandbox.Attrs{IdlePolicy: "v"}, tpl, sandbox.Attrs{IdlePolicy: "v", Layers: []string{"top", "base"}}},
		{"a snapshot's layers win", sandbox.Attrs{Layers: []string{"snap", "base"}}, tpl, sandbox.Attrs{Layers: []string{"snap", "base"}}},
		{"no template", sandbox.Attrs{}, nil, sandbox.Attrs{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := WithPinnedLayers(c.in, c.tpl)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			got.Layers = append(got.Layers[:0], "x") // must not alias the template's slice
			if tpl.Layers[0] != "top" {
				t.Errorf("the template's layers were changed: %v", tpl.Layers)
			}
		})
	}
}

// TestPinLegacy: sandboxes from before layer pins get pinned at daemon
// start when their template still matches; one whose template was rebuilt
// says so once, and its next boot moves it to the current layers, recorded.
func TestPinLegacy(t *testing.T) {
	defer goleak.VerifyNone(t)
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	layers, err := template.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, d := New(&testCore{st: st, dir: t.TempDir(), now: t0}, Config{}, layers)
	ctx := t.Context()
	tpl, err := st.PutTemplate(ctx, store.Template{Name: "t", Fingerprint: "fp2", Layers: []string{"new", "base"}, State: store.TemplateReady})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id, fp string, extra map[string]string) *sandbox.Sandbox {
		sb := &sandbox.Sandbox{ID: id, Owner: "alice", Template: "t", TemplateID: fp, Runtime: "runc",
			State: sandbox.Stopped, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), ExpiryAction: sandbox.ExpireStop,
			Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 64, DiskMiB: 64, Pids: 64}, Attrs: attrsOf(extra)}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	same := mk("same", "fp2", nil)
	rebuilt := mk("rebuilt", "fp1", nil)
	pinned := mk("pinned", "fp1", map[string]string{"layers": "old,base"})
	reasons := func(id string) []string {
		evs, err := st.ListEvents(ctx, store.EventFilter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range evs {
			if ev.Type == "layers" {
				out = append(out, ev.Reason)
			}
		}
		return out
	}
	get := func(id string) *sandbox.Sandbox {
		sb, err := st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	for range 2 { // a second daemon start changes nothing more
		for _, sb := range []*sandbox.Sandbox{same, rebuilt, pinned} {
			if err := d.PinLegacy(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := strings.Join(get("same").Layers, ","); got != "new,base" {
		t.Errorf("same: pinned %q, want the template's current layers", got)
	}
	if got := strings.Join(get("pinned").Layers, ","); got != "old,base" {
		t.Errorf("pinned: %q, want its own pin kept", got)
	}
	r := get("rebuilt")
	if strings.Join(r.Layers, ",") != "" || r.LayersUnpinned == "" || r.TemplateID != "fp1" {
		t.Errorf("rebuilt after pinLegacy: %+v", r.Attrs)
	}
	if diff := cmp.Diff([]string{"layers_unpinned"}, reasons("rebuilt")); diff != "" {
		t.Errorf("rebuilt events (-want +got)\n%s", diff)
	}
	if len(reasons("same"))+len(reasons("pinned")) != 0 {
		t.Errorf("events for sandboxes that needed no explanation: %v %v", reasons("same"), reasons("pinned"))
	}

	for _, sb := range []*sandbox.Sandbox{r, get("pinned"), get("same")} {
		if err := d.PinForBoot(ctx, sb, &tpl); err != nil {
			t.Fatal(err)
		}
	}
	r = get("rebuilt")
	if strings.Join(r.Layers, ",") != "new,base" || r.LayersUnpinned != "" || r.TemplateID != "fp2" {
		t.Errorf("rebuilt after its boot: template_id %s attrs %+v", r.TemplateID, r.Attrs)
	}
	if diff := cmp.Diff([]string{"layers_unpinned", "layers_rebased"}, reasons("rebuilt")); diff != "" {
		t.Errorf("rebuilt events (-want +got)\n%s", diff)
	}
	if p := get("pinned"); strings.Join(p.Layers, ",") != "old,base" || p.TemplateID != "fp1" {
		t.Errorf("a pinned sandbox moved at boot: %s %+v", p.TemplateID, p.Attrs)
	}
}

func TestMountedLayers(t *testing.T) {
	const mi = `22 1 0:21 / /proc rw,nosuid - proc proc rw
95 30 0:52 / /data/sandboxes/a/rootfs rw,relatime - overlay overlay rw,lowerdir=/data/layers/top:/data/layers/base,upperdir=/data/sandboxes/a/ws/upper,workdir=/data/sandboxes/a/ws/work,index=off
96 30 0:53 / /data/sandboxes/b/rootfs rw,relatime - overlay overlay rw,lowerdir=/data/layers/top:/elsewhere/base,upperdir=/u,workdir=/w
97 30 0:54 / /data/sandboxes/c/rootfs rw,relatime - ext4 /dev/loop0 rw
`
	for _, c := range []struct {
		name, mount string
		want        []string
		ok          bool
	}{
		{"layers of a mounted overlay", "/data/sandboxes/a/rootfs", []string{"top", "base"}, true},
		{"a lower outside the layer store", "/data/sandboxes/b/rootfs", nil, false},
		{"not an overlay", "/data/sandboxes/c/rootfs", nil, false},
		{"not mounted", "/data/sandboxes/d/rootfs", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := mountedLayers(mi, c.mount, "/data/layers/")
			if ok != c.ok || !cmp.Equal(got, c.want) {
				t.Errorf("got %v %v, want %v %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// attrsOf builds typed attrs from the legacy key/value form the tables use.
func attrsOf(extra map[string]string) sandbox.Attrs {
	a, _ := sandbox.AttrsFromExtra(extra)
	return a
}
