package quota

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestTally(t *testing.T) {
	sb := func(st sandbox.State) *sandbox.Sandbox {
		return &sandbox.Sandbox{State: st, Resources: sandbox.Resources{CPUMillis: 500, MemoryMiB: 256, DiskMiB: 1024}}
	}
	got := Tally([]*sandbox.Sandbox{sb(sandbox.Running), sb(sandbox.Paused), sb(sandbox.Creating),
		sb(sandbox.Stopped), sb(sandbox.Failed), sb(sandbox.Deleted)})
	want := Use{Sandboxes: 3, CPU: 1.5, MemoryMiB: 768, DiskMiB: 5 * 1024}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Tally (-want +got):\n%s", diff)
	}
}

func TestCheck(t *testing.T) {
	r := sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}
	for _, tc := range []struct {
		name  string
		l     Limits
		u     Use
		field string // "" = allowed
	}{
		{"unlimited", Limits{}, Use{Sandboxes: 1000, CPU: 1000}, ""},
		{"under every limit", Limits{Sandboxes: 3, CPU: 3, MemoryMiB: 2048, DiskMiB: 8192}, Use{Sandboxes: 2, CPU: 2, MemoryMiB: 1024, DiskMiB: 4096}, ""},
		{"exactly at the sandbox limit after adding", Limits{Sandboxes: 3}, Use{Sandboxes: 2}, ""},
		{"sandboxes", Limits{Sandboxes: 3}, Use{Sandboxes: 3}, "sandboxes"},
		{"cpu", Limits{CPU: 2.5}, Use{CPU: 2}, "cpu"},
		{"memory", Limits{MemoryMiB: 1000}, Use{MemoryMiB: 600}, "memory_mib"},
		{"disk", Limits{DiskMiB: 4096}, Use{DiskMiB: 2049}, "disk_mib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check("alice", tc.l, tc.u, r)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Check = %v, want allowed", err)
				}
				return
			}
			if errs.KindOf(err) != errs.ResourceExhausted || errs.FieldOf(err) != tc.field {
				t.Fatalf("Check = %v (kind %s, field %q), want resource_exhausted naming %q", err, errs.KindOf(err), errs.FieldOf(err), tc.field)
			}
		})
	}
	if err := CheckSnapshot("a", Limits{Snapshots: 1}, Use{Snapshots: 1}); errs.FieldOf(err) != "snapshots" {
		t.Errorf("CheckSnapshot = %v", err)
	}
}

func TestValidate(t *testing.T) {
	c := Config{Owners: map[string]Limits{"bob": {MemoryMiB: -1}}}
	if err := c.Validate(); errs.FieldOf(err) != "quotas.owners.bob.memory_mib" {
		t.Errorf("Validate = %v", err)
	}
	c = Config{Default: Limits{Sandboxes: 5}, Owners: map[string]Limits{"bob": {Sandboxes: 1}}}
	if c.For("bob").Sandboxes != 1 || c.For("eve").Sandboxes != 5 {
		t.Errorf("For: %+v %+v", c.For("bob"), c.For("eve"))
	}
}
