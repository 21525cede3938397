package merges

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestPrivate(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"var/lib/berth-agent", true},
		{"var/lib/berth-agent/restore-count", true},
		{"var/lib/berth-agentx", false},
		{"var/lib", false},
		{".berth-merge-abc", true},
		{".berth-merge-abc/new/0", true},
		{"root/.berth-merge-abc", false},
		{"etc/passwd", false},
	} {
		if got := private(tc.path); got != tc.want {
			t.Errorf("private(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestWithoutPrivate(t *testing.T) {
	p := &merge.Plan{Strategy: merge.ThreeWay,
		Writes:    []merge.Write{{Path: "root/f"}, {Path: "var/lib/berth-agent/restore-count"}},
		Deletes:   []merge.Delete{{Path: ".berth-merge-x/new/1"}, {Path: "root/g"}},
		Conflicts: []merge.Conflict{{ID: "c1", Path: "var/lib/berth-agent/x"}, {ID: "c2", Path: "etc/x"}},
	}
	want := &merge.Plan{Strategy: merge.ThreeWay,
		Writes:    []merge.Write{{Path: "root/f"}},
		Deletes:   []merge.Delete{{Path: "root/g"}},
		Conflicts: []merge.Conflict{{ID: "c2", Path: "etc/x"}},
	}
	if d := cmp.Diff(want, withoutPrivate(p)); d != "" {
		t.Errorf("withoutPrivate (-want +got):\n%s", d)
	}
	if len(p.Writes) != 2 {
		t.Error("withoutPrivate changed its input")
	}
}

func TestShifted(t *testing.T) {
	n := func(uid, gid uint32) *fsdiff.Node {
		return &fsdiff.Node{Type: fsdiff.TypeFile, Mode: 0o644, UID: uid, GID: gid}
	}
	p := &merge.Plan{
		Writes:  []merge.Write{{Path: "a", Node: *n(0, 0), Expect: n(1000, 1000)}, {Path: "b", Node: *n(70000, 5)}},
		Deletes: []merge.Delete{{Path: "c", Expect: n(2, 3)}},
	}
	if got := shifted(p, nil); got != p {
		t.Error("no user namespace: the plan should be used as is")
	}
	got := shifted(p, &rootfs.IDMap{HostID: 100000, Size: 65536})
	want := &merge.Plan{
		Writes:  []merge.Write{{Path: "a", Node: *n(100000, 100000), Expect: n(101000, 101000)}, {Path: "b", Node: *n(65534, 100005)}},
		Deletes: []merge.Delete{{Path: "c", Expect: n(100002, 100003)}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("shifted (-want +got):\n%s", d)
	}
	if p.Writes[0].Node.UID != 0 || p.Writes[0].Expect.UID != 1000 {
		t.Error("shifted changed its input")
	}
}

func TestWritable(t *testing.T) {
	for _, tc := range []struct {
		sb   sandbox.Sandbox
		want errs.Kind // 0: writable
	}{
		{sandbox.Sandbox{ID: "a", State: sandbox.Running, Runtime: "runc"}, 0},
		{sandbox.Sandbox{ID: "a", State: sandbox.Running, Runtime: "runsc"}, 0},
		{sandbox.Sandbox{ID: "a", State: sandbox.Stopped, Runtime: "runc"}, errs.FailedPrecondition},
		{sandbox.Sandbox{ID: "a", State: sandbox.Paused, Runtime: "runsc"}, errs.FailedPrecondition},
		{sandbox.Sandbox{ID: "a", State: sandbox.Running, Runtime: "firecracker"}, errs.NotImplemented},
	} {
		err := writable(&tc.sb)
		if (err == nil) != (tc.want == 0) || (err != nil && errs.KindOf(err) != tc.want) {
			t.Errorf("writable(%s %s) = %v, want kind %v", tc.sb.State, tc.sb.Runtime, err, tc.want)
		}
	}
}
