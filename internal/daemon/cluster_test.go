package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime/fake"
)

// TestCoreCreateWithID: cluster mode's create with the replica's id makes
// the sandbox under that id, bound to this node; the id again is
// AlreadyExists, a malformed one names the field; without an id nothing is
// bound (single host).
func TestCoreCreateWithID(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	n.d.Close()
	n.cfg.ClusterNode = "n1"
	n.start()
	ctx := context.Background()
	sb, err := n.d.Create(ctx, CreateRequest{ID: "abc123", Owner: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "abc123" || sb.Attrs.Cluster.Node != "n1" || sb.Attrs.Cluster.BoundAt.IsZero() {
		t.Fatalf("created %+v (cluster %+v), want id abc123 bound to n1", sb, sb.Attrs.Cluster)
	}
	n.assertRunning("abc123")
	if _, err := n.d.Create(ctx, CreateRequest{ID: "abc123", Owner: "alice", TTL: time.Hour}); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("same id again: %v, want AlreadyExists", err)
	}
	if _, err := n.d.Create(ctx, CreateRequest{ID: "../x", Owner: "alice"}); errs.FieldOf(err) != "id" {
		t.Fatalf("bad id: %v, want a field error naming id", err)
	}
	plain, err := n.d.Create(ctx, CreateRequest{Owner: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if plain.ID == "abc123" || plain.Attrs.Cluster.Node != "" {
		t.Fatalf("create without an id: %+v (cluster %+v), want a new id, not bound", plain, plain.Attrs.Cluster)
	}
	// A replica's signed create without an id (a warm hit that found no
	// member here): a new id, bound to n1 and awaiting its object.
	adopt, err := n.d.Create(ctx, CreateRequest{ClusterAdopt: true, Owner: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if cl := adopt.Attrs.Cluster; adopt.ID == "abc123" || cl.Node != "n1" || cl.BoundAt.IsZero() || cl.AdoptFrom.IsZero() {
		t.Fatalf("no-id cluster create: %s (cluster %+v), want a new id bound to n1 with AdoptFrom", adopt.ID, cl)
	}
	if got, err := n.d.Store().GetSandbox(ctx, adopt.ID); err != nil || got.Attrs.Cluster.AdoptFrom.IsZero() {
		t.Fatalf("stored no-id cluster create: %+v, %v", got, err)
	}
	for _, id := range []string{"abc123", plain.ID, adopt.ID} {
		if err := n.d.Delete(ctx, "alice", id); err != nil {
			t.Fatal(err)
		}
	}
}
