package e2b

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestUploadMetadata(t *testing.T) {
	many := http.Header{}
	for i := range 65 {
		many.Set("X-Metadata-K"+strings.Repeat("x", i), "v")
	}
	big := http.Header{}
	for i := range 5 {
		big.Set("X-Metadata-K"+string(rune('a'+i)), strings.Repeat("v", 900))
	}
	for _, c := range []struct {
		name   string
		h      http.Header
		want   map[string]string
		field  string // "" when valid
		prefix bool   // field is a prefix match
	}{
		{name: "none", h: http.Header{"Content-Type": {"x"}}, want: nil},
		{name: "lowercased, first value", h: http.Header{"X-Metadata-Owner-Team": {"infra", "other"}, "X-Metadata-A": {""}},
			want: map[string]string{"owner-team": "infra", "a": ""}},
		{name: "non-canonical header name", h: http.Header{"x-metadata-k": {"v"}}, want: map[string]string{"k": "v"}},
		{name: "value not printable", h: http.Header{"X-Metadata-K": {"a\x01"}}, field: "X-Metadata-k"},
		{name: "key too long", h: http.Header{"X-Metadata-" + strings.Repeat("k", 247): {"v"}}, field: "X-Metadata-k", prefix: true},
		{name: "too many keys", h: many, field: "X-Metadata-"},
		{name: "too many bytes", h: big, field: "X-Metadata-"},
		{name: "key with a colon", h: http.Header{"X-Metadata-A:b": {"v"}}, field: "X-Metadata-a:b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := uploadMetadata(c.h)
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(c.want, got); diff != "" {
					t.Fatalf("metadata (-want +got):\n%s", diff)
				}
				return
			}
			if !errs.Is(err, errs.InvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if f := errs.FieldOf(err); f != c.field && !(c.prefix && strings.HasPrefix(f, c.field)) {
				t.Fatalf("field %q, want %q", f, c.field)
			}
		})
	}
}
