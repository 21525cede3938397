package server

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/template"
)

// fill sets every exported field of v (a pointer) to a non-zero value, so a
// conversion that drops a field shows in the JSON.
func fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Pointer:
		if depth > 4 {
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	case reflect.String:
		v.SetString("s")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	}
}

func filled[T any]() T {
	var v T
	fill(reflect.ValueOf(&v).Elem(), 0)
	return v
}

// withExtra adds extra to every JSON object of v that is a sandbox.
func withExtra(v, extra any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = withExtra(e, extra)
		}
		if _, ok := x["template_id"]; ok && x["id"] != nil && x["runtime"] != nil {
			x["extra"] = extra
		}
	case []any:
		for i, e := range x {
			x[i] = withExtra(e, extra)
		}
	}
	return v
}

func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWireViewsCarryEveryField: each domain → wire conversion answers the
// same JSON the domain type would, field for field, so nothing is dropped
// (a field added to the domain type and not to the wire type fails here).
func TestWireViewsCarryEveryField(t *testing.T) {
	sb := filled[sandbox.Sandbox]()
	sb.State, sb.ExpiryAction, sb.PauseActual = sandbox.Paused, sandbox.ExpireStop, sandbox.PauseDisk
	allow, err := egress.ParseRule("example.com:443")
	if err != nil {
		t.Fatal(err)
	}
	ni := filled[hostnet.Info]()
	ni.Policy = egress.Policy{Mode: egress.Mode("rules"), Allow: []egress.Rule{allow}, Deny: []egress.Rule{allow}}
	fr := filled[checkpoint.ForkResult]()
	fr.Sandboxes = []*sandbox.Sandbox{&sb}
	cases := []struct {
		name         string
		domain, view any
	}{
		{"sandbox", &sb, sandboxView(&sb)},
		{"sandboxes", []*sandbox.Sandbox{&sb}, sandboxViews([]*sandbox.Sandbox{&sb})},
		{"event", []sandbox.Event{filled[sandbox.Event]()}, eventViews([]sandbox.Event{filled[sandbox.Event]()})},
		{"network", ni, networkView(&ni)},
		{"pool", filled[daemon.PoolStatus](), poolView(filled[daemon.PoolStatus]())},
		{"secret", []hostnet.SecretInfo{filled[hostnet.SecretInfo]()}, secretViews([]hostnet.SecretInfo{filled[hostnet.SecretInfo]()})},
		{"fork", fr, forkView(fr)},
		{"usage", filled[admission.UsageReport](), usageView(filled[admission.UsageReport]())},
		{"orphans", filled[admission.OrphanReport](), orphanView(filled[admission.OrphanReport]())},
		{"quota", filled[admission.QuotaInfo](), quotaView(filled[admission.QuotaInfo]())},
		{"port", filled[hostnet.PortInfo](), wire.PortInfo(filled[hostnet.PortInfo]())},
		{"build progress", filled[template.BuildProgress](), wire.BuildProgress(filled[template.BuildProgress]())},
		{"empty lists", []*sandbox.Sandbox{}, sandboxViews(nil)},
	}
	// The domain model keeps its typed Attrs out of JSON; the wire shows
	// them as the legacy "extra" map, which every sandbox here must carry.
	extra := asJSON(t, sb.LegacyExtra())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if d := cmp.Diff(withExtra(asJSON(t, c.domain), extra), asJSON(t, c.view)); d != "" {
				t.Errorf("wire view differs from the domain JSON (-domain +wire):\n%s", d)
			}
		})
	}
}

// TestWireMatchesAgentProtocol: the bodies the server passes through to and
// from the agent unchanged (exec events, processes, file entries, fs and
// signal requests) have the wire types' JSON exactly, both ways.
func TestWireMatchesAgentProtocol(t *testing.T) {
	pairs := []struct {
		name         string
		agent, wire_ func() any
	}{
		{"exec event", func() any { return new(agentapi.Event) }, func() any { return new(wire.ExecEvent) }},
		{"process", func() any { return new(agentapi.ProcessInfo) }, func() any { return new(wire.ProcessInfo) }},
		{"entry", func() any { return new(agentapi.EntryInfo) }, func() any { return new(wire.EntryInfo) }},
		{"tty", func() any { return new(agentapi.TTYSize) }, func() any { return new(wire.TTYSize) }},
		{"signal", func() any { return new(agentapi.SignalRequest) }, func() any { return new(wire.SignalRequest) }},
		{"resize", func() any { return new(agentapi.ResizeRequest) }, func() any { return new(wire.ResizeRequest) }},
		{"path", func() any { return new(agentapi.PathRequest) }, func() any { return new(wire.PathRequest) }},
		{"list", func() any { return new(agentapi.ListRequest) }, func() any { return new(wire.ListRequest) }},
		{"move", func() any { return new(agentapi.MoveRequest) }, func() any { return new(wire.MoveRequest) }},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			for _, dir := range [][2]func() any{{p.agent, p.wire_}, {p.wire_, p.agent}} {
				src, dst := dir[0](), dir[1]()
				fill(reflect.ValueOf(src).Elem(), 0)
				b, _ := json.Marshal(src)
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(dst); err != nil {
					t.Fatalf("%T → %T: %v", src, dst, err)
				}
				if d := cmp.Diff(asJSON(t, src), asJSON(t, dst)); d != "" {
					t.Errorf("%T → %T differs (-src +dst):\n%s", src, dst, d)
				}
			}
		})
	}
}

// TestWireConstants: the constants the wire package repeats from the
// domain are the domain's.
func TestWireConstants(t *testing.T) {
	if wire.PoolOwner != daemon.PoolOwner {
		t.Errorf("wire.PoolOwner = %q, daemon.PoolOwner = %q", wire.PoolOwner, daemon.PoolOwner)
	}
	for _, st := range sandbox.States() {
		found := false
		for _, w := range []wire.State{wire.StateCreating, wire.StateRunning, wire.StatePausing, wire.StatePaused,
			wire.StateResuming, wire.StateStopped, wire.StateFailed, wire.StateDeleted} {
			found = found || string(w) == string(st)
		}
		if !found {
			t.Errorf("state %q has no wire constant", st)
		}
	}
}
