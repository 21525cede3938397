package api

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// routeRe matches route registrations in internal/server/server.go, e.g.
// s.handle("GET /v1/sandboxes/{id}", ...) and s.mux.HandleFunc("GET /v1/health", ...).
// The method-less catch-all ("/v1/") does not match and is not an API route.
var routeRe = regexp.MustCompile(`s\.(?:handle|mux\.HandleFunc)\("([A-Z]+) (/[^"]*)"`)

// wildcardRe matches Go ServeMux wildcards: {name}, {name...} and {$}.
var wildcardRe = regexp.MustCompile(`\{(\$|[A-Za-z_][A-Za-z0-9_]*)(\.\.\.)?\}`)

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

type route struct{ method, path string }

func (r route) String() string { return strings.ToUpper(r.method) + " " + r.path }

// openAPIPath converts a ServeMux pattern path to an OpenAPI path template.
func openAPIPath(p string) string {
	return wildcardRe.ReplaceAllStringFunc(p, func(w string) string {
		m := wildcardRe.FindStringSubmatch(w)
		if m[1] == "$" {
			return ""
		}
		return "{" + m[1] + "}"
	})
}

func serverRoutes(t *testing.T) []route {
	t.Helper()
	src, err := os.ReadFile("../internal/server/server.go")
	if err != nil {
		t.Fatalf("read server routes: %v", err)
	}
	var out []route
	for _, m := range routeRe.FindAllStringSubmatch(string(src), -1) {
		out = append(out, route{method: strings.ToLower(m[1]), path: openAPIPath(m[2])})
	}
	if len(out) < 10 {
		t.Fatalf("found only %d routes in internal/server/server.go; has the registration syntax changed?", len(out))
	}
	return out
}

func loadDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml is not valid YAML: %v", err)
	}
	return doc
}

func mapAt(t *testing.T, v any, what string) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: want a mapping, got %T", what, v)
	}
	return m
}

func documentedRoutes(t *testing.T, doc map[string]any) map[route]map[string]any {
	t.Helper()
	out := map[route]map[string]any{}
	for p, item := range mapAt(t, doc["paths"], "paths") {
		for k, op := range mapAt(t, item, "paths."+p) {
			for _, m := range httpMethods {
				if k == m {
					out[route{method: m, path: p}] = mapAt(t, op, "paths."+p+"."+k)
				}
			}
		}
	}
	return out
}

func TestOpenAPIHeader(t *testing.T) {
	doc := loadDoc(t)
	if v, _ := doc["openapi"].(string); v != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", v)
	}
	schemes := mapAt(t, mapAt(t, doc["components"], "components")["securitySchemes"], "components.securitySchemes")
	if s := mapAt(t, schemes["apiKey"], "securitySchemes.apiKey"); s["in"] != "header" || s["name"] != "X-API-Key" {
		t.Errorf("apiKey scheme = %v, want header X-API-Key", s)
	}
	if s := mapAt(t, schemes["bearer"], "securitySchemes.bearer"); s["type"] != "http" || s["scheme"] != "bearer" {
		t.Errorf("bearer scheme = %v, want http bearer", s)
	}
}

// TestOpenAPICoversRoutes keeps the document and the router in step: every
// registered route is documented with its method, and nothing else is.
func TestOpenAPICoversRoutes(t *testing.T) {
	doc := loadDoc(t)
	documented := documentedRoutes(t, doc)
	registered := map[route]bool{}
	for _, r := range serverRoutes(t) {
		registered[r] = true
		if _, ok := documented[r]; !ok {
			t.Errorf("route %s is registered in internal/server/server.go but missing from api/openapi.yaml", r)
		}
	}
	var extra []string
	for r := range documented {
		if !registered[r] {
			extra = append(extra, r.String())
		}
	}
	sort.Strings(extra)
	for _, r := range extra {
		t.Errorf("api/openapi.yaml documents %s, which internal/server/server.go does not register", r)
	}
}

// TestOpenAPIOperations checks each operation's shape: a unique operationId,
// at least one 2xx response, every path template parameter declared, and
// every non-2xx response carrying the Error schema.
func TestOpenAPIOperations(t *testing.T) {
	doc := loadDoc(t)
	ids := map[string]route{}
	paths := mapAt(t, doc["paths"], "paths")
	for r, op := range documentedRoutes(t, doc) {
		id, _ := op["operationId"].(string)
		if id == "" {
			t.Errorf("%s: no operationId", r)
		} else if prev, dup := ids[id]; dup {
			t.Errorf("%s: operationId %q also used by %s", r, id, prev)
		}
		ids[id] = r

		declared := map[string]bool{}
		for _, src := range []any{mapAt(t, paths[r.path], r.path)["parameters"], op["parameters"]} {
			list, _ := src.([]any)
			for _, p := range list {
				pm := resolve(t, doc, p)
				if pm["in"] == "path" {
					declared[pm["name"].(string)] = true
				}
			}
		}
		for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(r.path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s: path parameter %q is not declared", r, m[1])
			}
		}

		responses := mapAt(t, op["responses"], r.String()+" responses")
		ok2xx := false
		for code, resp := range responses {
			if strings.HasPrefix(code, "2") {
				ok2xx = true
				continue
			}
			rm := resolve(t, doc, resp)
			content, _ := rm["content"].(map[string]any)
			js, _ := content["application/json"].(map[string]any)
			schema, _ := js["schema"].(map[string]any)
			if schema["$ref"] != "#/components/schemas/Error" {
				t.Errorf("%s: response %s does not use the Error schema", r, code)
			}
		}
		if !ok2xx {
			t.Errorf("%s: no 2xx response", r)
		}
		if _, authed := op["security"]; !authed {
			if _, ok := responses["401"]; !ok {
				t.Errorf("%s: authenticated operation without a 401 response", r)
			}
		}
	}
}

// TestOpenAPIRefsResolve checks that every $ref points at something.
func TestOpenAPIRefsResolve(t *testing.T) {
	doc := loadDoc(t)
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if k == "$ref" {
					ref, _ := c.(string)
					if _, err := lookup(doc, ref); err != "" {
						t.Errorf("%s: $ref %q: %s", at, ref, err)
					}
					continue
				}
				walk(c, at+"/"+k)
			}
		case []any:
			for _, c := range v {
				walk(c, at)
			}
		}
	}
	walk(doc, "#")
}

func lookup(doc map[string]any, ref string) (any, string) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, "only local refs are supported"
	}
	var cur any = doc
	for _, part := range strings.Split(rest, "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, "not a mapping at " + part
		}
		if cur, ok = m[part]; !ok {
			return nil, "no " + part
		}
	}
	return cur, ""
}

// resolve follows a $ref (if any) to its mapping.
func resolve(t *testing.T, doc map[string]any, v any) map[string]any {
	t.Helper()
	m := mapAt(t, v, "reference")
	if ref, ok := m["$ref"].(string); ok {
		target, err := lookup(doc, ref)
		if err != "" {
			t.Fatalf("$ref %q: %s", ref, err)
		}
		return mapAt(t, target, ref)
	}
	return m
}
