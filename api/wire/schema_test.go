package wire_test

import (
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/wire"
)

// body is what one operation sends and answers as JSON (or NDJSON): nil
// means no JSON body. oneOf lists the alternatives of a oneOf schema.
type body struct {
	req, resp any
}

type oneOf []any

// operations maps every documented operation to its wire types. A route
// added to the server and the spec must be added here (the test fails
// otherwise), so every body the API exchanges is checked.
var operations = map[string]body{
	"GET /v1/openapi.yaml":                                {},
	"GET /v1/audit":                                       {resp: wire.AuditList{}},
	"POST /v1/audit/verify":                               {resp: wire.AuditReport{}},
	"GET /v1/health":                                      {resp: wire.Health{}},
	"GET /v1/info":                                        {resp: wire.Info{}},
	"POST /v1/sandboxes":                                  {wire.CreateRequest{}, wire.Sandbox{}},
	"GET /v1/sandboxes":                                   {resp: wire.ListResponse{}},
	"GET /v1/sandboxes/{id}":                              {resp: wire.Sandbox{}},
	"DELETE /v1/sandboxes/{id}":                           {},
	"POST /v1/sandboxes/{id}/stop":                        {resp: wire.Sandbox{}},
	"POST /v1/sandboxes/{id}/start":                       {resp: wire.Sandbox{}},
	"POST /v1/sandboxes/{id}/extend":                      {wire.ExtendRequest{}, wire.Sandbox{}},
	"POST /v1/sandboxes/{id}/pause":                       {wire.PauseRequest{}, wire.Sandbox{}},
	"POST /v1/sandboxes/{id}/resume":                      {resp: wire.ResumeResult{}},
	"POST /v1/sandboxes/{id}/lease":                       {wire.LeaseRequest{}, wire.Sandbox{}},
	"GET /v1/sandboxes/{id}/events":                       {resp: []wire.Event{}},
	"GET /v1/sandboxes/{id}/activity":                     {resp: wire.ActivityList{}},
	"GET /v1/sandboxes/{id}/net":                          {resp: wire.NetworkInfo{}},
	"PUT /v1/sandboxes/{id}/net":                          {wire.NetworkRequest{}, wire.NetworkInfo{}},
	"GET /v1/sandboxes/{id}/net/log":                      {resp: wire.EgressLogResponse{}},
	"POST /v1/sandboxes/{id}/ports":                       {wire.PortRequest{}, wire.PortResponse{}},
	"GET /v1/sandboxes/{id}/ports":                        {resp: wire.PortList{}},
	"DELETE /v1/sandboxes/{id}/ports/{port}":              {},
	"GET /v1/secrets":                                     {resp: wire.SecretList{}},
	"PUT /v1/secrets/{name}":                              {wire.SecretRequest{}, wire.SecretInfo{}},
	"DELETE /v1/secrets/{name}":                           {},
	"GET /v1/sandboxes/{id}/leases":                       {resp: wire.LeaseList{}},
	"GET /v1/leases":                                      {resp: wire.LeaseList{}},
	"DELETE /v1/leases/{id}":                              {resp: wire.Lease{}},
	"POST /v1/sandboxes/{id}/snapshot":                    {wire.SnapshotRequest{}, wire.Snapshot{}},
	"POST /v1/sandboxes/{id}/fork":                        {wire.ForkRequest{}, wire.ForkResult{}},
	"POST /v1/sandboxes/{id}/merges":                      {wire.MergeRequest{}, wire.Merge{}},
	"GET /v1/sandboxes/{id}/merges":                       {resp: []wire.Merge{}},
	"GET /v1/sandboxes/{id}/merges/{mid}":                 {resp: wire.Merge{}},
	"POST /v1/sandboxes/{id}/merges/{mid}/abort":          {resp: wire.Merge{}},
	"POST /v1/sandboxes/{id}/merges/{mid}/continue":       {resp: wire.Merge{}},
	"GET /v1/sandboxes/{id}/conflicts":                    {resp: []wire.Conflict{}},
	"POST /v1/sandboxes/{id}/conflicts/{cid}/resolve":     {wire.ResolveRequest{}, wire.Merge{}},
	"GET /v1/snapshots":                                   {resp: []wire.Snapshot{}},
	"GET /v1/snapshots/{id}":                              {resp: wire.Snapshot{}},
	"DELETE /v1/snapshots/{id}":                           {},
	"POST /v1/snapshots/{id}/template":                    {wire.PromoteRequest{}, wire.Template{}},
	"POST /v1/sandboxes/{id}/checkpoints":                 {wire.CheckpointRequest{}, wire.Checkpoint{}},
	"GET /v1/sandboxes/{id}/checkpoints":                  {resp: wire.Timeline{}},
	"GET /v1/sandboxes/{id}/checkpoints/{ref}":            {resp: wire.Checkpoint{}},
	"DELETE /v1/sandboxes/{id}/checkpoints/{ref}":         {},
	"POST /v1/sandboxes/{id}/rewind":                      {wire.RewindRequest{}, wire.RewindResult{}},
	"POST /v1/sandboxes/{id}/promote":                     {wire.PromoteChildRequest{}, wire.PromoteChildResult{}},
	"GET /v1/sandboxes/{id}/effects":                      {resp: wire.EffectList{}},
	"GET /v1/sandboxes/{id}/diff":                         {resp: wire.DiffResult{}},
	"POST /v1/sandboxes/{id}/compare":                     {wire.CompareRequest{}, wire.CompareResult{}},
	"GET /v1/sandboxes/{id}/note":                         {resp: wire.CurrentNote{}},
	"POST /v1/sandboxes/{id}/note":                        {wire.NoteRequest{}, wire.Note{}},
	"GET /v1/sandboxes/{id}/notes":                        {resp: wire.NoteList{}},
	"GET /v1/sandboxes/{id}/notes/{seq}":                  {resp: wire.Note{}},
	"GET /v1/pools":                                       {resp: []wire.PoolStatus{}},
	"PUT /v1/pools/{template}":                            {wire.PoolRequest{}, wire.PoolStatus{}},
	"DELETE /v1/pools/{template}":                         {},
	"POST /v1/sandboxes/{id}/exec":                        {wire.ExecRequest{}, wire.ExecEvent{}},
	"GET /v1/sandboxes/{id}/processes":                    {resp: []wire.ProcessInfo{}},
	"POST /v1/sandboxes/{id}/processes/{pid}/attach":      {resp: wire.ExecEvent{}},
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":       {},
	"POST /v1/sandboxes/{id}/processes/{pid}/close-stdin": {},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal":      {req: wire.SignalRequest{}},
	"POST /v1/sandboxes/{id}/processes/{pid}/resize":      {req: wire.ResizeRequest{}},
	"GET /v1/sandboxes/{id}/files":                        {},
	"PUT /v1/sandboxes/{id}/files":                        {resp: wire.EntryInfo{}},
	"POST /v1/sandboxes/{id}/files:batch":                 {resp: wire.BatchResult{}},
	"GET /v1/sandboxes/{id}/files:batch":                  {},
	"POST /v1/sandboxes/{id}/fs/{op}": {
		oneOf{wire.PathRequest{}, wire.ListRequest{}, wire.MoveRequest{}},
		oneOf{wire.EntryInfo{}, []wire.EntryInfo{}},
	},
	"GET /v1/events":                  {resp: []wire.Event{}},
	"GET /v1/templates":               {resp: []wire.Template{}},
	"GET /v1/templates/{name}":        {resp: wire.Template{}},
	"PUT /v1/templates/{name}/tar":    {resp: wire.Template{}},
	"POST /v1/templates/{name}/pull":  {wire.PullRequest{}, wire.BuildEvent{}},
	"POST /v1/templates/{name}/build": {resp: wire.BuildEvent{}},
	"DELETE /v1/templates/{name}":     {resp: wire.TemplateDeleted{}},
	"POST /v1/keys":                   {wire.KeyRequest{}, wire.KeyResponse{}},
	"GET /v1/usage":                   {resp: wire.UsageReport{}},
	"GET /v1/reports/orphans":         {resp: wire.OrphanReport{}},
	"GET /v1/quotas":                  {resp: []wire.QuotaInfo{}},
	"GET /v1/quotas/{owner}":          {resp: wire.QuotaInfo{}},
	"PUT /v1/quotas/{owner}":          {wire.QuotaLimits{}, wire.QuotaInfo{}},
	"DELETE /v1/quotas/{owner}":       {},
	"GET /metrics":                    {},

	// Console operator views (issue 19).
	"GET /v1/usage/series":             {resp: wire.UsageSeries{}},
	"POST /v1/reports/orphans/cleanup": {wire.OrphanCleanupRequest{}, wire.OrphanCleanupResult{}},
	"GET /v1/builds":                   {resp: wire.TemplateBuildList{}},

	// Task ledger (issue 17).
	"GET /v1/sandboxes/{id}/tasks":                                 {resp: wire.TaskLedger{}},
	"POST /v1/sandboxes/{id}/tasks":                                {wire.TaskCreateRequest{}, wire.Task{}},
	"GET /v1/sandboxes/{id}/tasks/{task}":                          {resp: wire.Task{}},
	"GET /v1/sandboxes/{id}/tasks/{task}/history":                  {resp: []wire.TaskChange{}},
	"POST /v1/sandboxes/{id}/tasks/{task}/steps":                   {wire.TaskStepAddRequest{}, wire.Task{}},
	"POST /v1/sandboxes/{id}/tasks/{task}/steps/{step}/{op}":       {wire.TaskStepRequest{}, wire.Task{}},
	"POST /v1/sandboxes/{id}/tasks/{task}/gates":                   {wire.TaskGateRequest{}, wire.Task{}},
	"POST /v1/sandboxes/{id}/tasks/{task}/gates/{gate}/{decision}": {wire.TaskDecisionRequest{}, wire.Task{}},
}

var jsonTypes = []string{"application/json", "application/x-ndjson"}

type checker struct {
	t       *testing.T
	doc     map[string]any
	visited map[string]bool // component schemas reached
}

func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }

// resolve follows $ref chains (and a single-element allOf), recording the
// component schemas it passes.
func (c *checker) resolve(v any) map[string]any {
	m := mapOf(v)
	for i := 0; i < 10 && m != nil; i++ {
		if ref, ok := m["$ref"].(string); ok {
			rest, _ := strings.CutPrefix(ref, "#/")
			var cur any = c.doc
			for _, part := range strings.Split(rest, "/") {
				cur = mapOf(cur)[part]
			}
			if name, ok := strings.CutPrefix(ref, "#/components/schemas/"); ok {
				c.visited[name] = true
			}
			m = mapOf(cur)
			continue
		}
		if all, ok := m["allOf"].([]any); ok && len(all) == 1 && m["type"] == nil {
			m = mapOf(all[0])
			continue
		}
		if all, ok := m["allOf"].([]any); ok && len(all) > 1 && m["type"] == nil {
			m = c.mergeAll(all) // an object extending another (ResumeResult: a Sandbox plus its note)
			continue
		}
		break
	}
	return m
}

// mergeAll is the object schema of an allOf of object schemas: their
// properties and required lists together (what an embedded Go struct is).
func (c *checker) mergeAll(all []any) map[string]any {
	props, required := map[string]any{}, []any{}
	for _, part := range all {
		p := c.resolve(part)
		for k, v := range mapOf(p["properties"]) {
			props[k] = v
		}
		rq, _ := p["required"].([]any)
		required = append(required, rq...)
	}
	return map[string]any{"type": "object", "properties": props, "required": required}
}

// jsonFields lists a struct's JSON properties (embedded structs flattened)
// and whether each is always sent.
func jsonFields(t reflect.Type) (names []string, fields map[string]reflect.StructField, required map[string]bool) {
	fields, required = map[string]reflect.StructField{}, map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			n, fs, rq := jsonFields(f.Type)
			names = append(names, n...)
			for k, v := range fs {
				fields[k] = v
				required[k] = rq[k]
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		fields[name] = f
		required[name] = !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero")
	}
	return names, fields, required
}

var timeType = reflect.TypeOf(time.Time{})

func (c *checker) check(at string, t reflect.Type, schema any) {
	s := c.resolve(schema)
	if s == nil {
		c.t.Errorf("%s: no schema for Go type %s", at, t)
		return
	}
	if alts, ok := s["oneOf"].([]any); ok {
		c.t.Errorf("%s: oneOf (%d alternatives) where the Go type is %s", at, len(alts), t)
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	want := ""
	switch {
	case t == timeType:
		want = "string"
		if s["format"] != "date-time" {
			c.t.Errorf("%s: time.Time but format %v, want date-time", at, s["format"])
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		want = "string"
	case t.Kind() == reflect.String:
		want = "string"
	case t.Kind() == reflect.Bool:
		want = "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		want = "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		want = "number"
	case t.Kind() == reflect.Slice:
		want = "array"
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct:
		want = "object"
	default:
		c.t.Errorf("%s: Go type %s has no JSON schema mapping", at, t)
		return
	}
	if got, _ := s["type"].(string); got != want {
		c.t.Errorf("%s: schema type %q, Go type %s is %q", at, got, t, want)
		return
	}
	switch {
	case t == timeType || want != "array" && want != "object":
	case want == "array":
		c.check(at+"[]", t.Elem(), s["items"])
	case t.Kind() == reflect.Map:
		if ap, ok := s["additionalProperties"].(map[string]any); ok {
			c.check(at+"{}", t.Elem(), ap)
		} else {
			c.t.Errorf("%s: Go map %s but the schema has no additionalProperties schema", at, t)
		}
	default:
		c.checkStruct(at, t, s)
	}
}

func (c *checker) checkStruct(at string, t reflect.Type, s map[string]any) {
	names, fields, required := jsonFields(t)
	props := mapOf(s["properties"])
	for _, n := range names {
		p, ok := props[n]
		if !ok {
			c.t.Errorf("%s: wire.%s has property %q, the schema does not", at, t.Name(), n)
			continue
		}
		c.check(at+"."+n, fields[n].Type, p)
	}
	var extra []string
	for n := range props {
		if _, ok := fields[n]; !ok {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	for _, n := range extra {
		c.t.Errorf("%s: the schema has property %q, wire.%s does not", at, n, t.Name())
	}
	inSpec := map[string]bool{}
	rq, _ := s["required"].([]any) // absent: nothing required
	for _, r := range rq {
		inSpec[r.(string)] = true
	}
	for _, n := range names {
		switch {
		case required[n] && !inSpec[n]:
			c.t.Errorf("%s: wire.%s always sends %q (no omitempty) but the schema does not require it", at, t.Name(), n)
		case !required[n] && inSpec[n]:
			c.t.Errorf("%s: the schema requires %q but wire.%s may omit it (omitempty)", at, n, t.Name())
		}
	}
}

func (c *checker) checkBody(at string, goVal any, content map[string]any) {
	var schema any
	for _, ct := range jsonTypes {
		if js := mapOf(content[ct]); js != nil {
			schema = js["schema"]
		}
	}
	switch {
	case goVal == nil && schema == nil:
		return
	case goVal == nil:
		c.t.Errorf("%s: the spec documents a JSON body; add its wire type to operations", at)
		return
	case schema == nil:
		c.t.Errorf("%s: wire type %T but the spec documents no JSON body", at, goVal)
		return
	}
	if alts, ok := goVal.(oneOf); ok {
		specAlts, _ := c.resolve(schema)["oneOf"].([]any)
		if len(specAlts) != len(alts) {
			c.t.Errorf("%s: %d oneOf alternatives in the spec, %d wire types", at, len(specAlts), len(alts))
			return
		}
		for i, a := range alts {
			c.check(at, reflect.TypeOf(a), specAlts[i])
		}
		return
	}
	c.check(at, reflect.TypeOf(goVal), schema)
}

// TestWireMatchesOpenAPI checks every operation's request and 2xx response
// bodies against the wire types, every error response against wire.Error,
// and that every component schema is some wire type's (nothing documented
// that the code does not have).
func TestWireMatchesOpenAPI(t *testing.T) {
	var doc map[string]any
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	c := &checker{t: t, doc: doc, visited: map[string]bool{}}
	seen := map[string]bool{}
	for p, item := range mapOf(doc["paths"]) {
		for m, op := range mapOf(item) {
			switch m {
			case "get", "put", "post", "delete", "patch", "head", "options":
			default:
				continue
			}
			key := strings.ToUpper(m) + " " + p
			seen[key] = true
			b, ok := operations[key]
			if !ok {
				t.Errorf("%s is documented but has no entry in operations (wire types)", key)
				continue
			}
			opm := mapOf(op)
			c.checkBody(key+" request", b.req, mapOf(mapOf(c.resolveAny(opm["requestBody"]))["content"]))
			for code, r := range mapOf(opm["responses"]) {
				content := mapOf(c.resolveAny(r)["content"])
				if code == "204" {
					if len(content) != 0 {
						t.Errorf("%s: 204 with a body", key)
					}
					continue
				}
				if strings.HasPrefix(code, "2") {
					c.checkBody(key+" "+code, b.resp, content)
				} else {
					c.checkBody(key+" "+code, wire.Error{}, content)
				}
			}
		}
	}
	for key := range operations {
		if !seen[key] {
			t.Errorf("operations lists %s, which api/openapi.yaml does not document", key)
		}
	}
	var unused []string
	for name := range mapOf(mapOf(doc["components"])["schemas"]) {
		if !c.visited[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	for _, n := range unused {
		t.Errorf("components/schemas/%s is used by no operation's wire type", n)
	}
}

// resolveAny follows a $ref to a requestBody or response object.
func (c *checker) resolveAny(v any) map[string]any {
	m := mapOf(v)
	if ref, ok := m["$ref"].(string); ok {
		rest, _ := strings.CutPrefix(ref, "#/")
		var cur any = c.doc
		for _, part := range strings.Split(rest, "/") {
			cur = mapOf(cur)[part]
		}
		return mapOf(cur)
	}
	return m
}

// TestEnumsMatchConstants: the spec's enums are exactly the wire constants.
func TestEnumsMatchConstants(t *testing.T) {
	var doc map[string]any
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := mapOf(mapOf(doc["components"])["schemas"])
	for name, want := range map[string][]string{
		"State": {string(wire.StateCreating), string(wire.StateRunning), string(wire.StatePausing), string(wire.StatePaused),
			string(wire.StateResuming), string(wire.StateStopped), string(wire.StateFailed), string(wire.StateDeleted)},
		"PauseMode":    {string(wire.PauseFreeze), string(wire.PauseMemory), string(wire.PauseDisk)},
		"ExpiryAction": {string(wire.ExpireStop), string(wire.ExpireDelete), string(wire.ExpirePause)},
	} {
		var got []string
		enum, _ := mapOf(schemas[name])["enum"].([]any)
		for _, e := range enum {
			got = append(got, e.(string))
		}
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("components/schemas/%s enum = %v, wire constants = %v", name, got, want)
		}
	}
	ev := mapOf(mapOf(schemas["ExecEvent"])["properties"])["type"]
	var got []string
	for _, e := range mapOf(ev)["enum"].([]any) {
		got = append(got, e.(string))
	}
	want := []string{wire.ExecStart, wire.ExecStdout, wire.ExecStderr, wire.ExecPTY, wire.ExecExit, wire.ExecKeepalive, wire.ExecError}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("ExecEvent.type enum = %v, wire constants = %v", got, want)
	}
}
