package node

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
)

// TestDecide is the reconcile table: local state × object state → actions.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sb := func(id string, st sandbox.State, mod ...func(*sandbox.Sandbox)) *sandbox.Sandbox {
		s := &sandbox.Sandbox{ID: id, Owner: "alice", State: st, CreatedAt: now.Add(-time.Minute),
			ExpiresAt: now.Add(time.Hour), Attrs: sandbox.Attrs{Cluster: sandbox.ClusterState{Node: "n1", BoundAt: now.Add(-time.Minute)}}}
		for _, m := range mod {
			m(s)
		}
		return s
	}
	fresh := func(s *sandbox.Sandbox) { s.Attrs.Cluster.BoundAt = now.Add(-time.Second) }
	expired := func(s *sandbox.Sandbox) { s.ExpiresAt = now.Add(-time.Second) }
	paused := func(s *sandbox.Sandbox) { s.PauseActual = sandbox.PauseMemory }
	otherNode := func(s *sandbox.Sandbox) { s.Attrs.Cluster.Node = "" } // a pool member, a build
	// Made for a replica's no-id create (a warm claim, a fork's child) at
	// ago before now, its object not written yet (AdoptGrace is 30s here).
	adopt := func(ago time.Duration) func(*sandbox.Sandbox) {
		return func(s *sandbox.Sandbox) {
			s.Attrs.Cluster.AdoptFrom = now.Add(-ago)
			s.StartedAt = now.Add(-ago)
		}
	}
	bootedLongAgo := func(s *sandbox.Sandbox) { s.StartedAt = now.Add(-time.Hour) } // a pool member boots long before its claim
	forkChild := func(s *sandbox.Sandbox) { s.Attrs.Lineage = sandbox.Lineage{Parent: "p", Generation: 1} }
	cases := []struct {
		name    string
		local   []*sandbox.Sandbox
		objects []*sandbox.Sandbox
		removed map[string]bool
		want    []Action
	}{
		{name: "in sync", local: []*sandbox.Sandbox{sb("a", sandbox.Running)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Running)}},
		{name: "local ran ahead", local: []*sandbox.Sandbox{sb("a", sandbox.Paused, paused)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Running)},
			want: []Action{{Mirror, "a", ""}}},
		{name: "pause mode differs", local: []*sandbox.Sandbox{sb("a", sandbox.Paused, paused)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Paused)},
			want: []Action{{Mirror, "a", ""}}},
		{name: "creating locally", local: []*sandbox.Sandbox{sb("a", sandbox.Creating)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Creating)}},
		{name: "local failed", local: []*sandbox.Sandbox{sb("a", sandbox.Failed)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Creating)},
			want: []Action{{Mirror, "a", ""}}},
		{name: "object deleted", local: []*sandbox.Sandbox{sb("a", sandbox.Running)},
			want: []Action{{DeleteLocal, "a", ReasonObjectGone}}},
		{name: "object lost", local: []*sandbox.Sandbox{sb("a", sandbox.Running)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Lost)},
			want: []Action{{DeleteLocal, "a", ReasonNodeLost}}},
		{name: "object lost, local paused", local: []*sandbox.Sandbox{sb("a", sandbox.Paused)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Lost)},
			want: []Action{{DeleteLocal, "a", ReasonNodeLost}}},
		{name: "object says deleted", local: []*sandbox.Sandbox{sb("a", sandbox.Stopped)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Deleted)},
			want: []Action{{DeleteLocal, "a", ReasonObjectDeleted}}},
		{name: "lost and gone here", objects: []*sandbox.Sandbox{sb("a", sandbox.Lost)}},
		{name: "lost and removed here", objects: []*sandbox.Sandbox{sb("a", sandbox.Lost)}, removed: map[string]bool{"a": true}},
		{name: "bound, not made yet", objects: []*sandbox.Sandbox{sb("a", sandbox.Creating)},
			want: []Action{{Create, "a", ""}}},
		{name: "bound just now (the replica's create is on its way)", objects: []*sandbox.Sandbox{sb("a", sandbox.Creating, fresh)}},
		// Pending and bound: a scheduler bound an object no request waits on
		// (kubectl apply), so the node makes it at once, grace or not.
		{name: "bound pending just now (no forwarded create is coming)", objects: []*sandbox.Sandbox{sb("a", berthv1.StatePending, fresh)},
			want: []Action{{Create, "a", ""}}},
		{name: "bound pending, expired", objects: []*sandbox.Sandbox{sb("a", berthv1.StatePending, fresh, expired)},
			want: []Action{{MarkFailed, "a", ReasonExpired}}},
		{name: "bound, expired while waiting", objects: []*sandbox.Sandbox{sb("a", sandbox.Creating, expired)},
			want: []Action{{MarkFailed, "a", ReasonExpired}}},
		{name: "create failed before", objects: []*sandbox.Sandbox{sb("a", sandbox.Failed)}},
		{name: "deleted here, row gone", objects: []*sandbox.Sandbox{sb("a", sandbox.Running)}, removed: map[string]bool{"a": true},
			want: []Action{{DeleteObject, "a", ReasonObjectDeleted}}},
		{name: "deleted here, row in its deleted state", local: []*sandbox.Sandbox{sb("a", sandbox.Deleted)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Running)},
			want: []Action{{DeleteObject, "a", ReasonObjectDeleted}}},
		{name: "deleted here while the object was marked lost", local: []*sandbox.Sandbox{sb("a", sandbox.Deleted)}, objects: []*sandbox.Sandbox{sb("a", sandbox.Lost)}},
		// Marked deleted (by this node, or a replica's delete in flight):
		// a replica removes the object, the node does nothing more.
		{name: "object deleted, local gone", objects: []*sandbox.Sandbox{sb("a", sandbox.Deleted)}},
		{name: "removed here, object not marked yet", objects: []*sandbox.Sandbox{sb("a", sandbox.Running)}, removed: map[string]bool{"a": true},
			want: []Action{{DeleteObject, "a", ReasonObjectDeleted}}},
		{name: "ran here, vanished", objects: []*sandbox.Sandbox{sb("a", sandbox.Paused)},
			want: []Action{{MarkMissing, "a", ReasonMissing}}},
		{name: "not the cluster's: left alone", local: []*sandbox.Sandbox{sb("p", sandbox.Running, otherNode)}},
		// A fork made here: no cluster Attrs locally, its object recorded by
		// the replica that forwarded the fork — mirrored, not marked missing.
		{name: "fork with an object", local: []*sandbox.Sandbox{sb("f", sandbox.Paused, otherNode, paused)},
			objects: []*sandbox.Sandbox{sb("f", sandbox.Running)}, want: []Action{{Mirror, "f", ""}}},
		// The adoption grace: a sandbox made for a replica's no-id create
		// gets its object only from the node's answer.
		{name: "warm claim, object not written yet", local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(5*time.Second))}},
		{name: "warm claim of a member booted long ago, object not written yet",
			local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(5*time.Second), bootedLongAgo)}},
		{name: "warm claim never adopted (the replica died before writing the object)",
			local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(time.Minute))},
			want:  []Action{{DeleteLocal, "w", ReasonNeverAdopted}}},
		{name: "never adopted, paused meanwhile", local: []*sandbox.Sandbox{sb("w", sandbox.Paused, adopt(time.Minute), paused)},
			want: []Action{{DeleteLocal, "w", ReasonNeverAdopted}}},
		{name: "cold create for a no-id request, still booting past the grace",
			local: []*sandbox.Sandbox{sb("w", sandbox.Creating, adopt(time.Minute), func(s *sandbox.Sandbox) { s.StartedAt = time.Time{} })}},
		{name: "cold create for a no-id request, started just now after a long boot",
			local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(time.Minute), func(s *sandbox.Sandbox) { s.StartedAt = now.Add(-time.Second) })}},
		{name: "adopted: its object is seen", local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(5*time.Second))},
			objects: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(5*time.Second))}, want: []Action{{Adopt, "w", ""}}},
		{name: "adopted late, object behind", local: []*sandbox.Sandbox{sb("w", sandbox.Paused, adopt(time.Minute), paused)},
			objects: []*sandbox.Sandbox{sb("w", sandbox.Running)}, want: []Action{{Adopt, "w", ""}, {Mirror, "w", ""}}},
		{name: "adopted before, then its object deleted", local: []*sandbox.Sandbox{sb("w", sandbox.Running)},
			want: []Action{{DeleteLocal, "w", ReasonObjectGone}}},
		{name: "adopted, then lost", local: []*sandbox.Sandbox{sb("w", sandbox.Running, adopt(5*time.Second))},
			objects: []*sandbox.Sandbox{sb("w", sandbox.Lost)}, want: []Action{{Adopt, "w", ""}, {DeleteLocal, "w", ReasonNodeLost}}},
		{name: "never adopted, deleted here meanwhile", local: []*sandbox.Sandbox{sb("w", sandbox.Deleted, adopt(time.Minute))}},
		{name: "fork child through a replica, not recorded yet", local: []*sandbox.Sandbox{sb("f", sandbox.Running, forkChild, adopt(5*time.Second))}},
		{name: "fork child whose replica died before recording it", local: []*sandbox.Sandbox{sb("f", sandbox.Running, forkChild, adopt(time.Minute))},
			want: []Action{{DeleteLocal, "f", ReasonNeverAdopted}}},
		{name: "fork child recorded", local: []*sandbox.Sandbox{sb("f", sandbox.Running, forkChild, adopt(5*time.Second))},
			objects: []*sandbox.Sandbox{sb("f", sandbox.Running, adopt(5*time.Second))}, want: []Action{{Adopt, "f", ""}}},
		{name: "unclaimed pool member with no binding: left alone", local: []*sandbox.Sandbox{sb("p", sandbox.Running, otherNode, bootedLongAgo)}},
		{name: "several, in id order",
			local:   []*sandbox.Sandbox{sb("c", sandbox.Running), sb("b", sandbox.Paused, paused)},
			objects: []*sandbox.Sandbox{sb("b", sandbox.Running), sb("a", sandbox.Creating)},
			want:    []Action{{Create, "a", ""}, {Mirror, "b", ""}, {DeleteLocal, "c", ReasonObjectGone}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Decide(Inputs{Now: now, Node: "n1", Local: c.local, Objects: c.objects, Removed: c.removed, CreateGrace: 10 * time.Second, AdoptGrace: 30 * time.Second})
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Fatalf("actions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHolds: what a sandbox keeps from others, per state.
func TestHolds(t *testing.T) {
	for _, c := range []struct {
		st           sandbox.State
		mode         sandbox.PauseMode
		cpuMem, disk bool
	}{
		{sandbox.Running, "", true, true},
		{sandbox.Creating, "", true, true},
		{sandbox.Paused, sandbox.PauseFreeze, true, true},
		{sandbox.Paused, sandbox.PauseMemory, false, true},
		{sandbox.Stopped, "", false, true},
		{sandbox.Failed, "", false, true},
		{sandbox.Deleted, "", false, false},
	} {
		cm, d := holds(&sandbox.Sandbox{State: c.st, PauseActual: c.mode})
		if cm != c.cpuMem || d != c.disk {
			t.Errorf("%s/%s: holds = %v,%v, want %v,%v", c.st, c.mode, cm, d, c.cpuMem, c.disk)
		}
	}
}

// TestAllocated: CPU and memory of what has processes, disk of what is not
// deleted, ready pool members per fingerprint.
func TestAllocated(t *testing.T) {
	r := sandbox.Resources{CPUMillis: 1000, MemoryMiB: 256, DiskMiB: 1024, Pids: 100}
	member := sandbox.Attrs{Pool: sandbox.PoolState{Member: "tiny"}}
	local := []*sandbox.Sandbox{
		{ID: "a", State: sandbox.Running, Resources: r, TemplateID: "fp1"},
		{ID: "b", State: sandbox.Paused, PauseActual: sandbox.PauseDisk, Resources: r, TemplateID: "fp1"},
		{ID: "c", State: sandbox.Paused, PauseActual: sandbox.PauseFreeze, Resources: r, TemplateID: "fp1"},
		{ID: "d", State: sandbox.Deleted, Resources: r},
		{ID: "p1", State: sandbox.Running, Resources: r, TemplateID: "fp2", Attrs: member},
		{ID: "p2", State: sandbox.Running, Resources: r, TemplateID: "fp2", Attrs: member},
		{ID: "p3", State: sandbox.Creating, Resources: r, TemplateID: "fp1", Attrs: member},
	}
	alloc, pools := Allocated(local)
	want := berthv1.Resources{CPUMillis: 5000, MemoryMiB: 5 * 256, DiskMiB: 6 * 1024, Pids: 500}
	if diff := cmp.Diff(want, alloc); diff != "" {
		t.Errorf("allocated (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]berthv1.NodeWarmPool{{Fingerprint: "fp2", Ready: 2}}, pools); diff != "" {
		t.Errorf("warm pools (-want +got):\n%s", diff)
	}
}
