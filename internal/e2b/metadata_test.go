package e2b

import (
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestDecodeMetadataFilter(t *testing.T) {
	tests := []struct {
		name  string
		query string // the raw query as the SDK sends it
		want  map[string]string
		kind  errs.Kind
		fails bool
	}{
		{name: "absent", query: "", want: nil},
		{name: "simple", query: "metadata=app%3Dprod", want: map[string]string{"app": "prod"}},
		{
			name:  "protocol example with space, ampersand and equals",
			query: "metadata=user%252520id%3Da%252526b%26app%3Dprod",
			want:  map[string]string{"user id": "a&b", "app": "prod"},
		},
		{name: "equals in value", query: "metadata=" + url.QueryEscape(url.QueryEscape("k")+"="+url.QueryEscape("a=b")),
			want: map[string]string{"k": "a=b"}},
		{name: "literal plus survives", query: "metadata=" + url.QueryEscape("k="+url.PathEscape("a+b")),
			want: map[string]string{"k": "a+b"}},
		{name: "empty value", query: "metadata=k%3D", want: map[string]string{"k": ""}},
		{name: "bad escape", query: "metadata=%25zz", fails: true, kind: errs.InvalidArgument},
		{name: "empty key", query: "metadata=%3Dv", fails: true, kind: errs.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeMetadataFilter(q.Get("metadata"))
			if tt.fails {
				if err == nil || errs.KindOf(err) != tt.kind || errs.FieldOf(err) != "metadata" {
					t.Fatalf("err = %v (kind %v, field %q), want %v on metadata", err, errs.KindOf(err), errs.FieldOf(err), tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
