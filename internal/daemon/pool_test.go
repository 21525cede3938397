package daemon

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

func TestPoolable(t *testing.T) {
	base := CreateRequest{Template: "tiny", Runtime: "runc", Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024}}
	for _, tc := range []struct {
		name string
		edit func(r *CreateRequest)
		want bool
	}{
		{"plain", func(r *CreateRequest) {}, true},
		{"personalised", func(r *CreateRequest) {
			r.Owner, r.Actor, r.TTL, r.ExpiryAction = "bob", "bob", time.Hour, sandbox.ExpireDelete
			r.Labels, r.Env, r.AutoResume, r.Workstation = map[string]string{"a": "b"}, map[string]string{"K": "V"}, true, true
			r.Attrs = sandbox.Attrs{}
		}, true},
		{"a replica's warm hit (bound by the claim itself)", func(r *CreateRequest) { r.ClusterAdopt = true }, true},
		{"from snapshot", func(r *CreateRequest) { r.FromSnapshot = "s1" }, false},
		{"attrs (network policy, idle policy)", func(r *CreateRequest) { r.Attrs.IdlePolicy = "x" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.edit(&r)
			if got := poolable(r); got != tc.want {
				t.Errorf("poolable = %v, want %v", got, tc.want)
			}
		})
	}
}
