package pool

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/sandbox"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	long := now.Add(-time.Hour) // longer ago than shrinkAfter
	ready := Template{Ready: true, Fingerprint: "fp", Key: "k"}
	run := func(id string) Member { return Member{ID: id, Key: "k", TemplateID: "fp", State: sandbox.Running} }
	fixed := Spec{Template: "t", Size: 2}
	auto := Spec{Template: "t", Size: 2, Auto: true, Min: 1, Max: 8}
	for _, tc := range []struct {
		name    string
		spec    Spec
		st      State
		tpl     Template
		members []Member
		want    Actions
	}{
		{
			name: "empty pool starts its target",
			spec: fixed, st: State{Target: 2}, tpl: ready,
			want: Actions{Key: "k", Target: 2, Create: 2, Status: StateFilling},
		},
		{
			name: "members being started count against the target",
			spec: fixed, st: State{Key: "k", Target: 2, Starting: 1}, tpl: ready, members: []Member{run("a")},
			want: Actions{Key: "k", Ready: []string{"a"}, Target: 2, Create: 0, Status: StateFilling},
		},
		{
			name: "full pool is ready and clears its error",
			spec: fixed, st: State{Key: "k", Target: 2}, tpl: ready, members: []Member{run("a"), run("b")},
			want: Actions{Key: "k", Ready: []string{"a", "b"}, Target: 2, Status: StateReady, SetErr: true},
		},
		{
			name: "template not ready: drain everything, wait, say why",
			spec: fixed, st: State{Key: "k", Target: 2}, tpl: Template{Err: "template t is not ready"},
			members: []Member{run("a"), {ID: "b", State: sandbox.Creating}},
			want: Actions{Target: 2, Status: StateWaiting, SetErr: true, Err: "template t is not ready",
				Drain: []Drain{{"a", whyTemplateGone}, {"b", whyTemplateGone}}},
		},
		{
			name: "template rebuilt: members of the old fingerprint or shape are stale",
			spec: fixed, st: State{Key: "old", Target: 2}, tpl: ready,
			members: []Member{
				{ID: "oldkey", Key: "old", TemplateID: "fp", State: sandbox.Running},
				{ID: "oldfp", Key: "k", TemplateID: "fp0", State: sandbox.Running},
				run("a"),
			},
			want: Actions{Key: "k", Invalidated: true, Ready: []string{"a"}, Target: 2, Create: 1, Status: StateFilling,
				Drain: []Drain{{"oldkey", whyStale}, {"oldfp", whyStale}}},
		},
		{
			name: "failed and stopped members are drained, creating ones left alone",
			spec: fixed, st: State{Key: "k", Target: 2, Starting: 1}, tpl: ready,
			members: []Member{
				{ID: "f", Key: "k", TemplateID: "fp", State: sandbox.Failed},
				{ID: "s", Key: "k", TemplateID: "fp", State: sandbox.Stopped},
				{ID: "c", Key: "k", TemplateID: "fp", State: sandbox.Creating},
			},
			want: Actions{Key: "k", Target: 2, Create: 1, Status: StateFilling,
				Drain: []Drain{{"f", whyStale}, {"s", whyStale}}},
		},
		{
			name: "target shrank: the newest surplus is drained",
			spec: Spec{Template: "t", Size: 1}, st: State{Key: "k", Target: 1}, tpl: ready,
			members: []Member{run("old"), run("mid"), run("new")},
			want: Actions{Key: "k", Ready: []string{"old"}, Target: 1, Status: StateReady, SetErr: true,
				Drain: []Drain{{"new", whyStale}, {"mid", whyStale}}},
		},
		{
			name: "size zero drains every member",
			spec: Spec{Template: "t"}, st: State{Key: "k"}, tpl: ready, members: []Member{run("a")},
			want: Actions{Key: "k", Ready: []string{}, Status: StateReady, SetErr: true, Drain: []Drain{{"a", whyStale}}},
		},
		{
			name: "backoff: nothing is started until retryAt",
			spec: fixed, st: State{Key: "k", Target: 2, RetryAt: now.Add(time.Second)}, tpl: ready,
			want: Actions{Key: "k", Target: 2, Status: StateBackoff},
		},
		{
			name: "backoff over: start again",
			spec: fixed, st: State{Key: "k", Target: 2, RetryAt: now}, tpl: ready,
			want: Actions{Key: "k", Target: 2, Create: 2, Status: StateFilling},
		},
		{
			name: "auto pool shrinks by one after a quiet spell",
			spec: auto, st: State{Key: "k", Target: 3, LastMiss: long, LastResize: long}, tpl: ready,
			members: []Member{run("a"), run("b"), run("c")},
			want: Actions{Key: "k", Ready: []string{"a", "b"}, Target: 2, Resized: true, Status: StateReady, SetErr: true,
				Drain: []Drain{{"c", whyStale}}},
		},
		{
			name: "auto pool keeps its size after a recent miss",
			spec: auto, st: State{Key: "k", Target: 3, LastMiss: now.Add(-time.Second), LastResize: long}, tpl: ready,
			members: []Member{run("a"), run("b"), run("c")},
			want:    Actions{Key: "k", Ready: []string{"a", "b", "c"}, Target: 3, Status: StateReady, SetErr: true},
		},
		{
			name: "auto pool keeps its size right after a resize",
			spec: auto, st: State{Key: "k", Target: 3, LastMiss: long, LastResize: now.Add(-time.Minute)}, tpl: ready,
			members: []Member{run("a"), run("b"), run("c")},
			want:    Actions{Key: "k", Ready: []string{"a", "b", "c"}, Target: 3, Status: StateReady, SetErr: true},
		},
		{
			name: "auto pool never shrinks below min",
			spec: auto, st: State{Key: "k", Target: 1, LastMiss: long, LastResize: long}, tpl: ready,
			members: []Member{run("a")},
			want:    Actions{Key: "k", Ready: []string{"a"}, Target: 1, Status: StateReady, SetErr: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(now, tc.spec, tc.st, tc.tpl, tc.members)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeyFillsDefaults(t *testing.T) {
	def := sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024}
	a := Key("fp", "", sandbox.Resources{}, "runc", def)
	b := Key("fp", "runc", def, "runc", def)
	if a != b {
		t.Errorf("defaults not filled: %q vs %q", a, b)
	}
	for name, k := range map[string]string{
		"fingerprint": Key("fp2", "runc", sandbox.Resources{}, "runc", def),
		"runtime":     Key("fp", "runsc", sandbox.Resources{}, "runc", def),
		"cpu":         Key("fp", "runc", sandbox.Resources{CPUMillis: 500}, "runc", def),
		"memory":      Key("fp", "runc", sandbox.Resources{MemoryMiB: 256}, "runc", def),
		"disk":        Key("fp", "runc", sandbox.Resources{DiskMiB: 1}, "runc", def),
		"pids":        Key("fp", "runc", sandbox.Resources{Pids: 1}, "runc", def),
	} {
		if k == a {
			t.Errorf("%s not part of the key", name)
		}
	}
}

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {6, 32 * time.Second},
		{7, time.Minute}, {50, time.Minute},
	} {
		if got := Backoff(tc.failures); got != tc.want {
			t.Errorf("Backoff(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}

func TestInitialTarget(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want int
	}{
		{Spec{Size: 3}, 3},
		{Spec{Size: 0}, 0},
		{Spec{Size: 3, Auto: true, Min: 1, Max: 8}, 3},
		{Spec{Size: 0, Auto: true, Min: 2, Max: 8}, 2},
		{Spec{Size: 20, Auto: true, Min: 0, Max: 8}, 8},
	} {
		if got := initialTarget(tc.spec); got != tc.want {
			t.Errorf("initialTarget(%+v) = %d, want %d", tc.spec, got, tc.want)
		}
	}
}
