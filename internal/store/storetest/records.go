package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Conformance cases for the non-sandbox records: events, API keys,
// templates, settings. The entry point is TestStore in store_suite.go.

func suiteEvents(t *testing.T, s store.Store) {
	ctx := t.Context()
	var all []sandbox.Event
	for i, e := range []struct{ sb, owner string }{
		{"a", "alice"}, {"b", "bob"}, {"a", "alice"}, {"c", "alice"}, {"b", "bob"}, {"a", "alice"},
	} {
		ev := sandbox.Event{SandboxID: e.sb, Owner: e.owner, Time: suiteEpoch.Add(time.Duration(i) * time.Second),
			Actor: "test", Type: "note", Message: fmt.Sprint(i)}
		seq, err := s.AppendEvent(ctx, ev)
		if err != nil {
			t.Fatalf("AppendEvent: %v", err)
		}
		if len(all) > 0 && seq <= all[len(all)-1].Seq {
			t.Fatalf("seq %d not after previous %d", seq, all[len(all)-1].Seq)
		}
		ev.Seq = seq
		all = append(all, ev)
	}
	pick := func(idx ...int) []sandbox.Event {
		out := []sandbox.Event{}
		for _, i := range idx {
			out = append(out, all[i])
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    store.EventFilter
		want []sandbox.Event
	}{
		{"all", store.EventFilter{}, all},
		{"sandbox", store.EventFilter{SandboxID: "a"}, pick(0, 2, 5)},
		{"owner", store.EventFilter{Owner: "bob"}, pick(1, 4)},
		{"after seq", store.EventFilter{AfterSeq: all[2].Seq}, pick(3, 4, 5)},
		{"owner after seq", store.EventFilter{Owner: "alice", AfterSeq: all[2].Seq}, pick(3, 5)},
		{"limit", store.EventFilter{Limit: 2}, pick(0, 1)},
		{"sandbox limit after", store.EventFilter{SandboxID: "a", AfterSeq: all[0].Seq, Limit: 1}, pick(2)},
		{"none", store.EventFilter{SandboxID: "zzz"}, []sandbox.Event{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListEvents(ctx, tc.f)
			if err != nil {
				t.Fatalf("ListEvents: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, suiteOpts); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("events outlive their sandbox", func(t *testing.T) {
		mustCreate(t, s, suiteSandbox("gone", "alice", suiteEpoch))
		if _, err := s.Transition(ctx, "gone", sandbox.Deleted, sandbox.Event{Actor: "api"}, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteSandbox(ctx, "gone"); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListEvents(ctx, store.EventFilter{SandboxID: "gone"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].To != sandbox.Deleted {
			t.Errorf("events of deleted sandbox = %+v, want its one transition to deleted", got)
		}
	})
	t.Run("zero time defaults to now", func(t *testing.T) {
		seq, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "n", Type: "note"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.ListEvents(ctx, store.EventFilter{AfterSeq: seq - 1, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Time.IsZero() {
			t.Errorf("event = %+v, want a non-zero Time", got)
		}
	})
}

func suiteAPIKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	keys := []store.APIKey{
		{ID: "k1", Owner: "alice", Hash: []byte{1, 2, 3}, Admin: true, CreatedAt: suiteEpoch},
		{ID: "k2", Owner: "bob", Hash: []byte{4, 5, 6}, CreatedAt: suiteEpoch.Add(time.Second)},
		{ID: "k3", Owner: "alice", Hash: []byte{0, 0, 0}, CreatedAt: suiteEpoch.Add(2 * time.Second)},
	}
	for _, k := range keys {
		if err := s.CreateAPIKey(ctx, k); err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.ID, err)
		}
	}
	for _, k := range keys {
		got, err := s.LookupAPIKey(ctx, k.Hash)
		if err != nil {
			t.Fatalf("LookupAPIKey(%x): %v", k.Hash, err)
		}
		if diff := cmp.Diff(k, got); diff != "" {
			t.Errorf("LookupAPIKey(%x) (-want +got):\n%s", k.Hash, diff)
		}
	}
	for _, tc := range []struct {
		owner string
		want  []store.APIKey
	}{
		{"alice", []store.APIKey{keys[0], keys[2]}},
		{"bob", []store.APIKey{keys[1]}},
		{"", keys},
		{"nobody", []store.APIKey{}},
	} {
		t.Run("list owner="+tc.owner, func(t *testing.T) {
			got, err := s.ListAPIKeys(ctx, tc.owner)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, suiteOpts); diff != "" {
				t.Errorf("ListAPIKeys (-want +got):\n%s", diff)
			}
		})
	}
	if err := s.DeleteAPIKey(ctx, "k1"); err != nil {
		t.Fatalf("DeleteAPIKey: %v", err)
	}
	if _, err := s.LookupAPIKey(ctx, keys[0].Hash); !errs.Is(err, errs.NotFound) {
		t.Errorf("LookupAPIKey after delete: err = %v, want NotFound", err)
	}
}

func suiteTemplates(t *testing.T, s store.Store) {
	ctx := t.Context()
	py := store.Template{
		Name: "python", Fingerprint: "sha256:p1", Layers: []string{"sha256:top", "sha256:base"},
		StartCmd: []string{"/bin/sh", "-c", "sleep infinity"}, Env: map[string]string{"LANG": "C.UTF-8"},
		Workdir: "/work", User: "1000:1000", Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512},
		State: store.TemplateBuilding, Progress: "layer 1/2", Source: "oci:python:3.12",
		CreatedAt: suiteEpoch, UpdatedAt: suiteEpoch,
	}
	got, err := s.PutTemplate(ctx, py)
	if err != nil {
		t.Fatalf("PutTemplate: %v", err)
	}
	if diff := cmp.Diff(py, got, suiteOpts); diff != "" {
		t.Errorf("PutTemplate result (-want +got):\n%s", diff)
	}
	// An upsert keeps the original CreatedAt.
	py2 := py
	py2.State, py2.Progress, py2.Fingerprint = store.TemplateReady, "", "sha256:p2"
	py2.CreatedAt, py2.UpdatedAt = suiteEpoch.Add(time.Hour), suiteEpoch.Add(time.Minute)
	if _, err := s.PutTemplate(ctx, py2); err != nil {
		t.Fatalf("PutTemplate (update): %v", err)
	}
	py2.CreatedAt = suiteEpoch
	got, err = s.GetTemplate(ctx, "python")
	if err != nil {
		t.Fatalf("GetTemplate: %v", err)
	}
	if diff := cmp.Diff(py2, got, suiteOpts); diff != "" {
		t.Errorf("GetTemplate after upsert (-want +got):\n%s", diff)
	}
	// Zero timestamps are filled in.
	alpine, err := s.PutTemplate(ctx, store.Template{Name: "alpine", State: store.TemplateFailed, Error: "pull: 404"})
	if err != nil {
		t.Fatalf("PutTemplate(alpine): %v", err)
	}
	if alpine.CreatedAt.IsZero() || alpine.UpdatedAt.IsZero() {
		t.Errorf("PutTemplate left zero timestamps: %+v", alpine)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil {
		t.Fatalf("ListTemplates: %v", err)
	}
	if diff := cmp.Diff([]store.Template{alpine, py2}, list, suiteOpts); diff != "" {
		t.Errorf("ListTemplates (-want +got):\n%s", diff)
	}
	if err := s.DeleteTemplate(ctx, "python"); err != nil {
		t.Fatalf("DeleteTemplate: %v", err)
	}
	if _, err := s.GetTemplate(ctx, "python"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetTemplate after delete: err = %v, want NotFound", err)
	}
}

func suiteSettings(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, kv := range [][2]string{{"a", "1"}, {"b", ""}, {"a", "2"}} {
		if err := s.PutSetting(ctx, kv[0], kv[1]); err != nil {
			t.Fatalf("PutSetting(%q): %v", kv[0], err)
		}
	}
	for _, tc := range []struct{ key, want string }{{"a", "2"}, {"b", ""}} {
		got, err := s.GetSetting(ctx, tc.key)
		if err != nil {
			t.Fatalf("GetSetting(%q): %v", tc.key, err)
		}
		if got != tc.want {
			t.Errorf("GetSetting(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}
