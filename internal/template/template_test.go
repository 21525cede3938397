package template

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestFingerprint(t *testing.T) {
	a := strings.Repeat("a", 64)
	b := strings.Repeat("b", 64)
	base := Fingerprint([]string{a, b}, []string{"sleep", "1"}, nil)
	if !strings.HasPrefix(base, "sha256:") || len(base) != 71 {
		t.Fatalf("fingerprint %q", base)
	}
	if Fingerprint([]string{a, b}, []string{"sleep", "1"}, nil) != base {
		t.Fatal("fingerprint is not deterministic")
	}
	for name, other := range map[string]string{
		"layer order": Fingerprint([]string{b, a}, []string{"sleep", "1"}, nil),
		"start cmd":   Fingerprint([]string{a, b}, []string{"sleep 1"}, nil),
		"env":         Fingerprint([]string{a, b}, []string{"sleep", "1"}, []string{"A=1"}),
		"fields":      Fingerprint([]string{a, b, "sleep"}, []string{"1"}, nil),
	} {
		if other == base {
			t.Errorf("%s does not change the fingerprint", name)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Template{Name: "default", Layers: []string{strings.Repeat("0", 64)}, State: StateReady}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Template)
	}{
		{"name", func(t *Template) { t.Name = "Has Upper" }},
		{"name", func(t *Template) { t.Name = "" }},
		{"name", func(t *Template) { t.Name = "-x" }},
		{"state", func(t *Template) { t.State = "done" }},
		{"layers", func(t *Template) { t.Layers = nil }},
		{"digest", func(t *Template) { t.Layers = []string{"sha256:" + strings.Repeat("0", 64)} }},
		{"env", func(t *Template) { t.Env = []string{"NOEQUALS"} }},
	} {
		tpl := good
		tc.edit(&tpl)
		err := tpl.Validate()
		if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != tc.field {
			t.Errorf("%+v: Validate = %v, want InvalidArgument on %s", tpl, err, tc.field)
		}
	}
	building := Template{Name: "tpl.v2_x", State: StateBuilding}
	if err := building.Validate(); err != nil {
		t.Errorf("a building template needs no layers: %v", err)
	}
}
