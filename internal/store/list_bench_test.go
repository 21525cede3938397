package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// BenchmarkListSandboxes: the list behind GET /v1/sandboxes and `berth ls`
// with 1,000 sandboxes of the shape the scale bench creates (runc, the
// tiny template, deny-all network, a user namespace).
func BenchmarkListSandboxes(b *testing.B) {
	s, err := OpenSQLite(filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	t0 := time.Now().Add(-time.Hour)
	for i := range 1000 {
		sb := &sandbox.Sandbox{ID: fmt.Sprintf("sb%018d", i), Owner: "admin", Template: "tiny", TemplateID: "7656a6f3e0d28efce5295b56c545e20e",
			Runtime: "runc", State: sandbox.Running, Reason: "created", Labels: map[string]string{},
			Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024},
			CreatedAt: t0.Add(time.Duration(i) * time.Millisecond), StartedAt: t0, ExpiresAt: t0.Add(3 * time.Hour), ExpiryAction: sandbox.ExpireStop,
			AccessTokenHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			Attrs: sandbox.Attrs{Layers: []string{"b7b4270bf694b5183b5c8c1bffcc024cf537fa1738b956a6160cccf1bf2ca4ac"},
				Net: sandbox.NetState{Policy: []byte(`{"mode":"deny-all"}`)}, UserNS: "2000000000:65536"}}
		if err := s.CreateSandbox(b.Context(), sb); err != nil {
			b.Fatal(err)
		}
	}
	states := []sandbox.State{}
	for _, st := range sandbox.States() {
		if st != sandbox.Deleted {
			states = append(states, st)
		}
	}
	for b.Loop() {
		list, _, err := s.ListSandboxes(b.Context(), SandboxFilter{States: states})
		if err != nil || len(list) != 1000 {
			b.Fatal(len(list), err)
		}
	}
}
