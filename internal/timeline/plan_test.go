package timeline

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

func TestDeltaBase(t *testing.T) {
	boot := []string{"t2", "t1"}
	for _, tc := range []struct {
		name     string
		head     *store.TimelineHead
		want     []string
		wantPrev string
	}{
		{"no checkpoint yet", nil, []string{"t2", "t1"}, ""},
		{"a checkpoint since boot", &store.TimelineHead{Checkpoint: "c1", Layers: []string{"d1", "t2", "t1"}}, []string{"d1", "t2", "t1"}, "c1"},
		{"rewound: the head is the boot stack", &store.TimelineHead{Checkpoint: "c2", Layers: []string{"d2", "d1", "t2", "t1"}}, []string{"d2", "d1", "t2", "t1"}, "c2"},
		{"restarted on other layers since (promote)", &store.TimelineHead{Checkpoint: "c1", Layers: []string{"d1", "x", "t1"}}, []string{"t2", "t1"}, ""},
		{"head shorter than boot", &store.TimelineHead{Checkpoint: "c1", Layers: []string{"t1"}}, []string{"t2", "t1"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, prev := deltaBase(tc.head, boot)
			if d := cmp.Diff(tc.want, got); d != "" || prev != tc.wantPrev {
				t.Errorf("deltaBase = %v, %q; want %v, %q (%s)", got, prev, tc.want, tc.wantPrev, d)
			}
		})
	}
	// The base is a copy: appending the new delta must not write into the head.
	h := &store.TimelineHead{Checkpoint: "c1", Layers: make([]string, 3, 10)}
	copy(h.Layers, []string{"d1", "t2", "t1"})
	base, _ := deltaBase(h, boot)
	_ = append([]string{"new"}, base...)
	base[0] = "changed"
	if h.Layers[0] != "d1" {
		t.Errorf("deltaBase aliases the head's layers")
	}
}

func TestResolve(t *testing.T) {
	list := []store.Checkpoint{{ID: "abc", Seq: 1, Name: "before"}, {ID: "def", Seq: 2}, {ID: "ghi", Seq: 3, Name: "after"}}
	for _, tc := range []struct {
		ref, want string
		kind      errs.Kind // when want is ""
	}{
		{"abc", "abc", 0}, {"after", "ghi", 0}, {"2", "def", 0}, {"#3", "ghi", 0},
		{"nope", "", errs.NotFound}, {"9", "", errs.NotFound}, {"", "", errs.InvalidArgument},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			c, err := resolve(list, tc.ref, "to")
			if (err == nil) != (tc.want != "") || (err != nil && errs.KindOf(err) != tc.kind) || c.ID != tc.want {
				t.Errorf("resolve(%q) = %q, %v; want %q, kind %q", tc.ref, c.ID, err, tc.want, tc.kind)
			}
			if tc.kind == errs.InvalidArgument && errs.FieldOf(err) != "to" {
				t.Errorf("error names field %q, want to", errs.FieldOf(err))
			}
		})
	}
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{"before-refactor": true, "v1.2_x": true, "a": true, "12": false, "": false,
		"Upper": false, "-x": false, "a/b": false, "x y": false, string(make([]byte, 64)): false} {
		if err := validName(name); (err == nil) != ok {
			t.Errorf("validName(%q) = %v, want ok=%v", name, err, ok)
		} else if err != nil && errs.FieldOf(err) != "name" {
			t.Errorf("validName(%q) names field %q", name, errs.FieldOf(err))
		}
	}
}

func TestRewindMode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		c       store.Checkpoint
		rt      string
		imageOK bool
		want    bool
		reason  bool
	}{
		{"files only", store.Checkpoint{Runtime: "runc"}, "runc", false, false, false},
		{"memory", store.Checkpoint{Runtime: "runc", MemoryPath: "/m"}, "runc", true, true, false},
		{"other runtime", store.Checkpoint{Runtime: "runsc", MemoryPath: "/m"}, "runc", true, false, true},
		{"image gone", store.Checkpoint{Runtime: "runc", MemoryPath: "/m"}, "runc", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := rewindMode(tc.c, tc.rt, tc.imageOK)
			if got != tc.want || (why != "") != tc.reason {
				t.Errorf("rewindMode = %v, %q; want %v, reason %v", got, why, tc.want, tc.reason)
			}
		})
	}
}

func TestLayerRefsAndChildren(t *testing.T) {
	r := layerRefs{templates: [][]string{{"t1"}}, checkpoints: [][]string{{"d2", "d1", "t1"}}, heads: [][]string{{"d3", "t1"}}}
	for dg, want := range map[string]bool{"t1": true, "d1": true, "d3": true, "d9": false} {
		if r.used(dg) != want {
			t.Errorf("used(%s) = %v, want %v", dg, !want, want)
		}
	}
	all := []childRef{{"a", "p", false}, {"b", "p", false}, {"c", "p", true}, {"d", "q", false}, {"p", "", false}}
	if d := cmp.Diff([]string{"b"}, otherChildren("p", "a", all)); d != "" {
		t.Errorf("otherChildren (-want +got):\n%s", d)
	}
}

func TestPromoteLayers(t *testing.T) {
	for _, tc := range []struct {
		captured string
		child    []string
		want     []string
	}{
		{"l", []string{"s", "t"}, []string{"l", "s", "t"}},
		{"e", []string{"e", "t"}, []string{"e", "t"}}, // an empty upper over an empty snapshot layer
		{"l", nil, []string{"l"}},
	} {
		child := slices.Clone(tc.child)
		if d := cmp.Diff(tc.want, promoteLayers(tc.captured, tc.child)); d != "" {
			t.Errorf("promoteLayers(%s, %v) (-want +got):\n%s", tc.captured, tc.child, d)
		}
		if !slices.Equal(child, tc.child) {
			t.Errorf("promoteLayers changed its input")
		}
	}
}
