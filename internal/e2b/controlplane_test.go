package e2b

import (
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestCreateRequest(t *testing.T) {
	s := New(nil, nil, Options{MaxTimeout: time.Hour})
	i64 := func(v int64) *int64 { return &v }
	f, tr := false, true
	tests := []struct {
		name  string
		body  newSandboxJSON
		v2    bool
		want  daemon.CreateRequest
		field string
	}{
		{name: "2.51 body", v2: true,
			body: newSandboxJSON{TemplateID: "base", Timeout: i64(120), Metadata: map[string]string{"team": "a"}},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 120 * time.Second,
				ExpiryAction: sandbox.ExpireDelete, Labels: map[string]string{"team": "a"}}},
		{name: "v2 default timeout", v2: true, body: newSandboxJSON{TemplateID: "py"},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "py", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete}},
		{name: "v1 default timeout", body: newSandboxJSON{TemplateID: "base"},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 15 * time.Second, ExpiryAction: sandbox.ExpireDelete}},
		{name: "timeout capped, envs, lifecycle", v2: true,
			body: newSandboxJSON{TemplateID: "base", Timeout: i64(86400), EnvVars: map[string]string{"A": "1"},
				AutoPause: true, AutoPauseMemory: &tr, AutoResume: &autoResumeJSON{Enabled: true}},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: time.Hour, Env: map[string]string{"A": "1"},
				ExpiryAction: sandbox.ExpirePause, AutoResume: true}},
		{name: "filesystem-only auto-pause", v2: true,
			body: newSandboxJSON{TemplateID: "base", AutoPause: true, AutoPauseMemory: &f},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 300 * time.Second,
				ExpiryAction: sandbox.ExpirePause, Attrs: sandbox.Attrs{ExpiryPauseMode: sandbox.PauseDisk}}},
		{name: "autoPauseMemory without autoPause", v2: true,
			body: newSandboxJSON{TemplateID: "base", AutoPauseMemory: &f},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete}},
		{name: "auto-resume of a filesystem-only pause", v2: true,
			body:  newSandboxJSON{TemplateID: "base", AutoPause: true, AutoPauseMemory: &f, AutoResume: &autoResumeJSON{Enabled: true}},
			field: "autoResume"},
		{name: "negative timeout is zero", v2: true, body: newSandboxJSON{TemplateID: "base", Timeout: i64(-5)},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", ExpiryAction: sandbox.ExpireDelete}},
		{name: "no internet access", v2: true, body: newSandboxJSON{TemplateID: "py", AllowInternetAccess: &f},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "py", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete,
				Network: "deny-all"}},
		{name: "internet access", v2: true, body: newSandboxJSON{TemplateID: "py", AllowInternetAccess: &tr},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "py", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete,
				Network: "allow-all"}},
		{name: "missing template", v2: true, body: newSandboxJSON{}, field: "templateID"},
		{name: "network rules", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{"denyOut":["0.0.0.0/0"]}`)}, field: "network.denyOut"},
		{name: "network rules beside public traffic", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{"allowPublicTraffic":true,"maskRequestHost":"x"}`)}, field: "network.maskRequestHost"},
		{name: "public traffic", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{"allowPublicTraffic":true}`)},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete,
				Attrs: sandbox.Attrs{PublicTraffic: true}}},
		{name: "private traffic", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{"allowPublicTraffic":false}`)},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete}},
		{name: "empty network", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{}`)},
			want: daemon.CreateRequest{Owner: "o", Actor: "e2b", Template: "default", TTL: 300 * time.Second, ExpiryAction: sandbox.ExpireDelete}},
		{name: "public traffic not a boolean", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`{"allowPublicTraffic":"yes"}`)}, field: "network.allowPublicTraffic"},
		{name: "network not an object", v2: true, body: newSandboxJSON{TemplateID: "base", Network: json.RawMessage(`true`)}, field: "network"},
		{name: "volumes", v2: true, body: newSandboxJSON{TemplateID: "base", VolumeMounts: []json.RawMessage{json.RawMessage(`{}`)}}, field: "volumeMounts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.createRequest("o", tt.body, tt.v2)
			if tt.field != "" {
				if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tt.field {
					t.Fatalf("err = %v, want invalid %s", err, tt.field)
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

func TestListFilter(t *testing.T) {
	s := New(nil, nil, Options{})
	running := []sandbox.State{sandbox.Creating, sandbox.Running, sandbox.Resuming}
	paused := []sandbox.State{sandbox.Pausing, sandbox.Paused}
	tests := []struct {
		name  string
		query string
		want  daemon.ListFilter
		field string
	}{
		{name: "defaults", query: "",
			want: daemon.ListFilter{Owner: "o", Limit: 100, Order: "desc", States: append(append([]sandbox.State{}, running...), paused...)}},
		{name: "comma states, paging, filters",
			query: "state=paused,running&limit=2&nextToken=abc&order=asc&template=base&startedAfter=2026-01-02T03:04:05Z&metadata=user%252520id%3Da%252526b",
			want: daemon.ListFilter{Owner: "o", Limit: 2, Cursor: "abc", Order: "asc", Template: "default",
				CreatedAfter: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Labels: map[string]string{"user id": "a&b"},
				States: append(append([]sandbox.State{}, paused...), running...)}},
		{name: "repeated state", query: "state=running&state=running",
			want: daemon.ListFilter{Owner: "o", Limit: 100, Order: "desc", States: append(append([]sandbox.State{}, running...), running...)}},
		{name: "limit capped", query: "limit=1000",
			want: daemon.ListFilter{Owner: "o", Limit: 100, Order: "desc", States: append(append([]sandbox.State{}, running...), paused...)}},
		{name: "bad state", query: "state=stopped", field: "state"},
		{name: "bad limit", query: "limit=0", field: "limit"},
		{name: "bad order", query: "order=up", field: "order"},
		{name: "bad time", query: "startedAfter=yesterday", field: "startedAfter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.listFilter("o", q)
			if tt.field != "" {
				if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tt.field {
					t.Fatalf("err = %v, want invalid %s", err, tt.field)
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

func TestDetailJSON(t *testing.T) {
	s := New(nil, nil, Options{})
	keep := true
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	sb := &sandbox.Sandbox{ID: "abc", Template: "default", State: sandbox.Paused, CreatedAt: t0,
		StartedAt: t0.Add(time.Second), ExpiresAt: t0.Add(time.Hour), ExpiryAction: sandbox.ExpirePause, AutoResume: true,
		Resources:      sandbox.Resources{CPUMillis: 1500, MemoryMiB: 512, DiskMiB: 1024},
		PauseRequested: sandbox.PauseMemory, PauseActual: sandbox.PauseDisk}
	want := detailJSON{SandboxID: "abc", TemplateID: "base", ClientID: "6532622b", EnvdVersion: EnvdVersion, EnvdAccessToken: "tok",
		StartedAt: t0.Add(time.Second), EndAt: t0.Add(time.Hour), State: "paused", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024,
		Metadata: map[string]string{}, Lifecycle: &lifecycleJSON{OnTimeout: "pause", AutoResume: true, KeepMemory: &keep},
		Network:   &networkJSON{AllowPublicTraffic: false},
		PauseMode: "disk", PauseRequested: "memory"}
	if diff := cmp.Diff(want, s.toDetailJSON(sb, "paused", true, "tok")); diff != "" {
		t.Errorf("detail (-want +got):\n%s", diff)
	}
	// autoPauseMemory: false: the lifecycle says an expiry pause keeps no memory.
	fsOnly := *sb
	fsOnly.AutoResume, fsOnly.ExpiryPauseMode = false, sandbox.PauseDisk
	if got := s.toDetailJSON(&fsOnly, "paused", true, "tok").Lifecycle; got.KeepMemory == nil || *got.KeepMemory || got.OnTimeout != "pause" {
		t.Errorf("filesystem-only lifecycle = %+v", got)
	}
	// allowPublicTraffic: true is shown back, as E2B's getInfo does.
	public := *sb
	public.PublicTraffic = true
	if got := s.toDetailJSON(&public, "paused", true, "tok").Network; got == nil || !got.AllowPublicTraffic {
		t.Errorf("public sandbox's network = %+v", got)
	}
	// A warm-pool member booted before it was claimed: startedAt is the claim.
	claimed := *sb
	claimed.CreatedAt, claimed.StartedAt = t0.Add(time.Minute), t0
	if got := s.toDetailJSON(&claimed, "running", false, ""); !got.StartedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("claimed pool member startedAt = %s, want its claim %s", got.StartedAt, t0.Add(time.Minute))
	}
	listed := s.toDetailJSON(sb, "paused", false, "tok")
	if listed.EnvdAccessToken != "" || listed.Lifecycle != nil {
		t.Errorf("listed sandbox leaks detail-only fields: %+v", listed)
	}
	for st, want := range map[sandbox.State]string{sandbox.Running: "running", sandbox.Creating: "running", sandbox.Resuming: "running",
		sandbox.Pausing: "paused", sandbox.Paused: "paused", sandbox.Stopped: "", sandbox.Failed: "", sandbox.Deleted: ""} {
		if got, ok := e2bState(st); got != want || ok != (want != "") {
			t.Errorf("e2bState(%s) = %q, %v", st, got, ok)
		}
	}
}
