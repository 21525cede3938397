//go:build ignore

// genv6 wrote testdata/v6.db with the store of schema version 6 (commit
// 6f9fdec, the last release whose sandboxes carried an Extra map): the
// sandboxes a real daemon writes — a fork, a pool member, a claimed one,
// one with policy/secrets/ports, a legacy one. It no longer builds (Extra is
// gone); it is kept to say how the fixture was made.
package main

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func main() {
	_ = os.Remove("v6.db")
	st, err := store.OpenSQLite("v6.db")
	if err != nil {
		log.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	mk := func(id string, extra map[string]string) {
		sb := &sandbox.Sandbox{ID: id, Owner: "alice", Template: "default", TemplateID: "sha256:aa", Runtime: "runc",
			State: sandbox.Running, CreatedAt: t0, StartedAt: t0, ExpiresAt: t0.Add(time.Hour),
			ExpiryAction: sandbox.ExpireDelete, Extra: extra}
		if err := st.CreateSandbox(context.Background(), sb); err != nil {
			log.Fatal(err)
		}
	}
	mk("fork1", map[string]string{"fork_parent": "parent1", "fork_generation": "2", "fork_mode": "memory",
		"snapshot": "snap1", "layers": "sha256:l1,sha256:l2", "userns": "2000000000:65536",
		"network_policy": `{"allow":["pypi.org"]}`, "secrets": `[{"name":"gh","placeholder":"BERTH_SECRET_abc"}]`,
		"idle_policy": "never"})
	mk("member1", map[string]string{"pool": "default", "pool_key": "sha256:aa|1000|512|runc", "userns": "none",
		"layers": "sha256:l1"})
	mk("claimed1", map[string]string{"claimed_from_pool": "default", "lease_until": "2026-11-30T13:00:00Z",
		"pause_ms": "42", "netns_path": "/run/netns/berth-claimed1",
		"ports": `{"8080":{"token_hash":"ab12","created_at":"2026-11-30T12:00:00Z"}}`})
	mk("legacy1", map[string]string{"layers_unpinned": "template removed before pinning", "e2b_auto_pause_memory": "false",
		"some_future_key": "kept"})
	mk("plain1", nil)
	if err := st.Close(); err != nil {
		log.Fatal(err)
	}
}
