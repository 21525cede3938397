package berthv1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/testutil"
)

// crd is the part of a CustomResourceDefinition the test reads.
type crd struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Group string `yaml:"group"`
		Scope string `yaml:"scope"`
		Names struct {
			Kind       string   `yaml:"kind"`
			ListKind   string   `yaml:"listKind"`
			Plural     string   `yaml:"plural"`
			Singular   string   `yaml:"singular"`
			ShortNames []string `yaml:"shortNames"`
			Categories []string `yaml:"categories"`
		} `yaml:"names"`
		Versions []struct {
			Name         string         `yaml:"name"`
			Served       bool           `yaml:"served"`
			Storage      bool           `yaml:"storage"`
			Subresources map[string]any `yaml:"subresources"`
			Columns      []struct {
				Name     string `yaml:"name"`
				Type     string `yaml:"type"`
				JSONPath string `yaml:"jsonPath"`
			} `yaml:"additionalPrinterColumns"`
			Schema struct {
				OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
			} `yaml:"schema"`
		} `yaml:"versions"`
	} `yaml:"spec"`
}

// kinds are the Go types of the CRDs, by kind, with their collections and
// whether the kind has a status subresource (only Node: a Sandbox's state
// and fields are one conditional PUT).
var kinds = map[string]struct {
	typ    reflect.Type
	list   reflect.Type
	res    kube.Resource
	status bool
}{
	"Sandbox":  {reflect.TypeFor[berthv1.Sandbox](), reflect.TypeFor[berthv1.SandboxList](), berthv1.Sandboxes, false},
	"Template": {reflect.TypeFor[berthv1.Template](), reflect.TypeFor[berthv1.TemplateList](), berthv1.Templates, false},
	"WarmPool": {reflect.TypeFor[berthv1.WarmPool](), reflect.TypeFor[berthv1.WarmPoolList](), berthv1.WarmPools, false},
	"Node":     {reflect.TypeFor[berthv1.Node](), reflect.TypeFor[berthv1.NodeList](), berthv1.Nodes, true},
	"Record":   {reflect.TypeFor[berthv1.Record](), reflect.TypeFor[berthv1.RecordList](), berthv1.Records, false},
}

func loadCRDs(t *testing.T) map[string]crd {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), "deploy", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in deploy/crds: %v", err)
	}
	out := map[string]crd{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c crd
		if err := yaml.Unmarshal(b, &c); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if c.Kind != "CustomResourceDefinition" {
			t.Fatalf("%s: kind %q", f, c.Kind)
		}
		if want := berthv1.Group + "_" + c.Spec.Names.Plural + ".yaml"; filepath.Base(f) != want {
			t.Errorf("%s: file should be named %s", f, want)
		}
		out[c.Spec.Names.Kind] = c
	}
	return out
}

// TestCRDsMatchTypes fails when a Go field of berthv1 is missing from the
// CRD's schema, when the schema has a field the Go types do not, or when
// their types disagree: the API server prunes unknown fields of a
// structural schema silently, so a drift here loses data.
func TestCRDsMatchTypes(t *testing.T) {
	crds := loadCRDs(t)
	for kind, k := range kinds {
		t.Run(kind, func(t *testing.T) {
			c, ok := crds[kind]
			if !ok {
				t.Fatalf("no CRD for kind %s", kind)
			}
			n := c.Spec.Names
			if c.Spec.Group != berthv1.Group || c.Metadata.Name != n.Plural+"."+berthv1.Group || n.Plural != k.res.Plural ||
				n.ListKind != k.list.Name() || n.Kind != k.typ.Name() || n.Singular != strings.ToLower(kind) {
				t.Errorf("names: group %q name %q plural %q listKind %q singular %q", c.Spec.Group, c.Metadata.Name, n.Plural, n.ListKind, n.Singular)
			}
			if (c.Spec.Scope == "Namespaced") != k.res.Namespaced {
				t.Errorf("scope %q, Go resource namespaced=%v", c.Spec.Scope, k.res.Namespaced)
			}
			if len(n.ShortNames) == 0 || len(n.Categories) == 0 {
				t.Errorf("shortNames %v, categories %v: want both", n.ShortNames, n.Categories)
			}
			if len(c.Spec.Versions) != 1 {
				t.Fatalf("%d versions, want exactly %s", len(c.Spec.Versions), berthv1.Version)
			}
			v := c.Spec.Versions[0]
			if v.Name != berthv1.Version || !v.Served || !v.Storage {
				t.Errorf("version %q served=%v storage=%v", v.Name, v.Served, v.Storage)
			}
			if _, has := v.Subresources["status"]; has != k.status {
				t.Errorf("status subresource: %v, want %v", has, k.status)
			}
			schema := v.Schema.OpenAPIV3Schema
			for _, p := range compare("", schema, k.typ) {
				t.Error(p)
			}
			if len(v.Columns) == 0 {
				t.Error("no printer columns")
			}
			for _, col := range v.Columns {
				if err := resolve(schema, col.JSONPath, col.Type); err != nil {
					t.Errorf("column %s: %v", col.Name, err)
				}
			}
		})
	}
	for kind := range crds {
		if _, ok := kinds[kind]; !ok {
			t.Errorf("CRD for kind %s has no Go type in berthv1", kind)
		}
	}
}

// TestCompareCatchesDrift makes sure the walk above can fail: a field the
// schema lacks, a field only the schema has, and a type mismatch.
func TestCompareCatchesDrift(t *testing.T) {
	type inner struct {
		A string `json:"a"`
	}
	type obj struct {
		kube.TypeMeta   `json:",inline"`
		kube.ObjectMeta `json:"metadata"`
		Name            string            `json:"name"`
		Count           int32             `json:"count,omitempty"`
		In              inner             `json:"in"`
		When            *time.Time        `json:"when,omitempty"`
		Tags            map[string]string `json:"tags,omitempty"`
		Skip            string            `json:"-"`
	}
	good := map[string]any{"type": "object", "properties": map[string]any{
		"apiVersion": map[string]any{"type": "string"}, "kind": map[string]any{"type": "string"},
		"metadata": map[string]any{"type": "object"},
		"name":     map[string]any{"type": "string"}, "count": map[string]any{"type": "integer"},
		"in":   map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string"}}},
		"when": map[string]any{"type": "string", "format": "date-time"},
		"tags": map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}},
	}}
	if p := compare("", good, reflect.TypeFor[obj]()); len(p) != 0 {
		t.Fatalf("matching schema reported: %v", p)
	}
	mutate := func(f func(props map[string]any)) map[string]any {
		b, _ := yaml.Marshal(good)
		var c map[string]any
		_ = yaml.Unmarshal(b, &c)
		f(c["properties"].(map[string]any))
		return c
	}
	for name, tc := range map[string]struct {
		schema map[string]any
		want   string
	}{
		"missing":   {mutate(func(p map[string]any) { delete(p, "count") }), ".count: in the Go type, not in the schema"},
		"extra":     {mutate(func(p map[string]any) { p["color"] = map[string]any{"type": "string"} }), ".color: in the schema, not in the Go type"},
		"nested":    {mutate(func(p map[string]any) { p["in"].(map[string]any)["properties"] = map[string]any{} }), ".in.a: in the Go type"},
		"type":      {mutate(func(p map[string]any) { p["count"] = map[string]any{"type": "string"} }), ".count: schema type \"string\", Go int32 wants \"integer\""},
		"time":      {mutate(func(p map[string]any) { p["when"] = map[string]any{"type": "string"} }), ".when: a time wants format date-time"},
		"map value": {mutate(func(p map[string]any) { p["tags"] = map[string]any{"type": "object"} }), ".tags: a map wants additionalProperties"},
	} {
		t.Run(name, func(t *testing.T) {
			p := compare("", tc.schema, reflect.TypeFor[obj]())
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("problems %q, want one containing %q", p, tc.want)
			}
		})
	}
}

// compare walks schema against the JSON encoding of typ and returns every
// disagreement, each naming the field's path.
func compare(path string, schema map[string]any, typ reflect.Type) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if schema == nil {
		return []string{path + ": no schema"}
	}
	got, _ := schema["type"].(string)
	bad := func(want string) []string {
		return []string{fmt.Sprintf("%s: schema type %q, Go %s wants %q", path, got, typ, want)}
	}
	if typ == reflect.TypeFor[time.Time]() {
		if got != "string" {
			return bad("string")
		}
		if schema["format"] != "date-time" {
			return []string{path + ": a time wants format date-time"}
		}
		return nil
	}
	switch typ.Kind() {
	case reflect.String:
		if got != "string" {
			return bad("string")
		}
	case reflect.Bool:
		if got != "boolean" {
			return bad("boolean")
		}
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint32, reflect.Uint64:
		if got != "integer" {
			return bad("integer")
		}
		if f, ok := schema["format"].(string); ok && f != "int"+fmt.Sprint(typ.Bits()) {
			return []string{fmt.Sprintf("%s: format %s for a Go %s", path, f, typ)}
		}
	case reflect.Float32, reflect.Float64:
		if got != "number" {
			return bad("number")
		}
	case reflect.Slice:
		if got != "array" {
			return bad("array")
		}
		items, _ := schema["items"].(map[string]any)
		return compare(path+"[]", items, typ.Elem())
	case reflect.Map:
		if got != "object" {
			return bad("object")
		}
		add, _ := schema["additionalProperties"].(map[string]any)
		if add == nil {
			return []string{path + ": a map wants additionalProperties"}
		}
		return compare(path+"{}", add, typ.Elem())
	case reflect.Struct:
		if got != "object" {
			return bad("object")
		}
		if schema["x-kubernetes-preserve-unknown-fields"] == true {
			return []string{path + ": preserves unknown fields: the schema must say what the type says"}
		}
		props, _ := schema["properties"].(map[string]any)
		fields := jsonFields(typ)
		var out []string
		for name, ft := range fields {
			p := path + "." + name
			if name == "metadata" && ft == reflect.TypeFor[kube.ObjectMeta]() {
				// The API server owns metadata's schema; a CRD may only say object.
				if m, _ := props[name].(map[string]any); m == nil || m["type"] != "object" || m["properties"] != nil {
					out = append(out, p+": want {type: object}")
				}
				continue
			}
			sub, ok := props[name].(map[string]any)
			if !ok {
				out = append(out, p+": in the Go type, not in the schema")
				continue
			}
			out = append(out, compare(p, sub, ft)...)
		}
		for name := range props {
			if _, ok := fields[name]; !ok {
				out = append(out, path+"."+name+": in the schema, not in the Go type")
			}
		}
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if _, ok := fields[fmt.Sprint(r)]; !ok {
					out = append(out, fmt.Sprintf("%s: required %v is not a field", path, r))
				}
			}
		}
		sort.Strings(out)
		return out
	default:
		return []string{fmt.Sprintf("%s: Go kind %s not handled", path, typ.Kind())}
	}
	return nil
}

// jsonFields is the JSON object encoding/json makes of a struct: exported
// fields by their tag names, embedded structs without a name (or ",inline")
// flattened into it.
func jsonFields(typ reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			maps(out, jsonFields(f.Type))
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func maps(dst, src map[string]reflect.Type) {
	for k, v := range src {
		dst[k] = v
	}
}

// resolve checks that a printer column's JSONPath names a field of the
// schema of the column's type (a filter [?(...)] steps into an array).
func resolve(schema map[string]any, jsonPath, colType string) error {
	if jsonPath == ".metadata.creationTimestamp" {
		if colType != "date" {
			return fmt.Errorf("%s is a date", jsonPath)
		}
		return nil
	}
	p := regexp.MustCompile(`\[\?\(@\.[a-zA-Z]+=="[^"]*"\)\]`).ReplaceAllString(jsonPath, "[]")
	cur := schema
	for _, part := range strings.Split(strings.TrimPrefix(p, "."), ".") {
		arr := strings.HasSuffix(part, "[]")
		props, _ := cur["properties"].(map[string]any)
		next, ok := props[strings.TrimSuffix(part, "[]")].(map[string]any)
		if !ok {
			return fmt.Errorf("%s: no field %q", jsonPath, part)
		}
		if arr {
			if next["type"] != "array" {
				return fmt.Errorf("%s: %s is not an array", jsonPath, part)
			}
			next, _ = next["items"].(map[string]any)
		}
		cur = next
	}
	want := map[string]string{"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}[colType]
	if colType == "date" && cur["format"] == "date-time" {
		return nil
	}
	if want == "" || cur["type"] != want {
		return fmt.Errorf("%s: column type %s, field type %v", jsonPath, colType, cur["type"])
	}
	return nil
}

// prop is the schema at a dotted path of a kind's schema.
func prop(t *testing.T, crds map[string]crd, kind, path string) map[string]any {
	t.Helper()
	cur := crds[kind].Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, part := range strings.Split(path, ".") {
		if part == "[]" {
			cur, _ = cur["items"].(map[string]any)
			continue
		}
		props, _ := cur["properties"].(map[string]any)
		cur, _ = props[part].(map[string]any)
		if cur == nil {
			t.Fatalf("%s: no %s", kind, path)
		}
	}
	return cur
}

func enumOf(t *testing.T, crds map[string]crd, kind, path string) []string {
	t.Helper()
	var out []string
	for _, v := range prop(t, crds, kind, path)["enum"].([]any) {
		out = append(out, fmt.Sprint(v))
	}
	sort.Strings(out)
	return out
}

func sorted[T ~string](vs ...T) []string {
	var out []string
	for _, v := range vs {
		out = append(out, string(v))
	}
	sort.Strings(out)
	return out
}

// TestCRDEnums ties the schemas' enums to the Go constants they stand for:
// a state or mode added in Go and not here would be refused by the API
// server at the first write.
func TestCRDEnums(t *testing.T) {
	crds := loadCRDs(t)
	states := append(sandbox.States(), sandbox.Lost, berthv1.StatePending)
	for _, tc := range []struct {
		kind, path string
		want       []string
	}{
		{"Sandbox", "status.state", sorted(states...)},
		{"Sandbox", "status.pauseMode", sorted(sandbox.PauseFreeze, sandbox.PauseMemory, sandbox.PauseDisk)},
		{"Sandbox", "spec.expiryAction", sorted(sandbox.ExpireStop, sandbox.ExpirePause, sandbox.ExpireDelete)},
		{"Sandbox", "spec.durationClass", sorted(placement.Short, placement.Interactive, placement.Long)},
		{"Sandbox", "spec.durationClass", sorted(berthv1.ClassShort, berthv1.ClassInteractive, berthv1.ClassLong)},
		{"Sandbox", "spec.network.mode", sorted(egress.DenyAll, egress.AllowAll, egress.Rules)},
		{"Sandbox", "spec.runtime", []string{"runc", "runsc"}},
		{"WarmPool", "spec.runtime", []string{"runc", "runsc"}},
		{"Node", "status.runtimes.[].name", []string{"runc", "runsc"}},
		{"Template", "status.state", []string{"building", "failed", "ready"}},
	} {
		if got := enumOf(t, crds, tc.kind, tc.path); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: enum %v, want %v", tc.kind, tc.path, got, tc.want)
		}
	}
	for _, path := range []string{"spec.resources.cpuMillis", "spec.resources.memoryMiB", "spec.resources.diskMiB", "spec.resources.pids"} {
		if m, ok := prop(t, crds, "Sandbox", path)["minimum"].(int); !ok || m != 0 {
			t.Errorf("Sandbox %s: minimum %v, want 0", path, prop(t, crds, "Sandbox", path)["minimum"])
		}
	}
}

// TestExpectedDurationPattern: the schema's pattern accepts what Go's
// time.Duration prints and nothing time.ParseDuration refuses (nor a negative one).
func TestExpectedDurationPattern(t *testing.T) {
	crds := loadCRDs(t)
	re := regexp.MustCompile(prop(t, crds, "Sandbox", "spec.expectedDuration")["pattern"].(string))
	for _, d := range []time.Duration{0, time.Millisecond, 90 * time.Second, 45 * time.Minute, 2*time.Hour + 30*time.Minute, 1500 * time.Microsecond} {
		if !re.MatchString(d.String()) {
			t.Errorf("pattern refuses %q", d)
		}
	}
	for _, s := range []string{"", "5", "5 minutes", "1d", "-1s", "1h 2m", "h", "1.5.2s", "1s\n"} {
		if re.MatchString(s) {
			t.Errorf("pattern accepts %q", s)
		}
	}
}
