package rootfs

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestOverlayData(t *testing.T) {
	l := LayoutOf("/s/x")
	tests := []struct {
		name   string
		lowers []string
		want   string
		kind   errs.Kind
	}{
		{name: "one", lowers: []string{"/l/a"},
			want: "lowerdir=/l/a,upperdir=/s/x/ws/upper,workdir=/s/x/ws/work,index=off,xino=off,redirect_dir=off,metacopy=off"},
		{name: "top first, cleaned", lowers: []string{"/l/top/", "/l//base"},
			want: "lowerdir=/l/top:/l/base,upperdir=/s/x/ws/upper,workdir=/s/x/ws/work,index=off,xino=off,redirect_dir=off,metacopy=off"},
		{name: "none", lowers: nil, kind: errs.InvalidArgument},
		{name: "relative", lowers: []string{"l/a"}, kind: errs.InvalidArgument},
		{name: "colon", lowers: []string{"/l/a:b"}, kind: errs.InvalidArgument},
		{name: "comma", lowers: []string{"/l/a,b"}, kind: errs.InvalidArgument},
		{name: "too long", lowers: repeat("/layers/0123456789012345678901234567890123456789012345678901234567890123", 60), kind: errs.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := overlayData(l, tt.lowers)
			if tt.want == "" {
				if err == nil || errs.KindOf(err) != tt.kind {
					t.Fatalf("overlayData(%q) = %q, %v; want kind %v", tt.lowers, got, err, tt.kind)
				}
				if errs.FieldOf(err) != "lowers" {
					t.Errorf("error names field %q, want lowers", errs.FieldOf(err))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("overlayData (-want +got):\n%s", d)
			}
		})
	}
}

func TestLayoutOf(t *testing.T) {
	want := Layout{Dir: "/d", Image: "/d/disk.img", WS: "/d/ws", Upper: "/d/ws/upper", Work: "/d/ws/work", RootFS: "/d/rootfs"}
	if d := cmp.Diff(want, LayoutOf("/d")); d != "" {
		t.Errorf("LayoutOf (-want +got):\n%s", d)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:       "/a/b",
		`/a\040b`:    "/a b",
		`/a\134b`:    `/a\b`,
		`/a\011\012`: "/a\t\n",
		`/a\04`:      `/a\04`,
		`/tail\`:     `/tail\`,
		`/x\999y`:    `/x\999y`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
