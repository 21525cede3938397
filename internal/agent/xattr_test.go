package agent_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// TestFileMetadata: metadata on a write lands as user.e2b.* xattrs, comes
// back on stat, list and move, a write replaces the set (none clears it),
// xattrs outside the prefix are not reported, and out-of-bounds sets are
// refused naming the field.
func TestFileMetadata(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	meta := map[string]string{"owner": "infra", "step": "3"}
	info, err := e.client.WriteFileMetadata(ctx, "m.txt", "", 0, meta, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(meta, info.Metadata); d != "" {
		t.Fatalf("write metadata (-want +got):\n%s", d)
	}
	p := filepath.Join(e.home, "m.txt")
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, "user.e2b.owner", buf)
	if err != nil || string(buf[:n]) != "infra" {
		t.Fatalf("xattr user.e2b.owner = %q, %v", buf[:n], err)
	}
	if err := unix.Lsetxattr(p, "user.other", []byte("hidden"), 0); err != nil {
		t.Fatal(err)
	}
	st, err := e.client.Stat(ctx, agentapi.PathRequest{Path: "m.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(meta, st.Metadata); d != "" {
		t.Fatalf("stat metadata (-want +got):\n%s", d)
	}
	ls, err := e.client.List(ctx, agentapi.ListRequest{Path: e.home})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, en := range ls {
		if en.Name == "m.txt" {
			found = true
			if d := cmp.Diff(meta, en.Metadata); d != "" {
				t.Fatalf("list metadata (-want +got):\n%s", d)
			}
		}
	}
	if !found {
		t.Fatal("m.txt not listed")
	}
	mv, err := e.client.Move(ctx, agentapi.MoveRequest{Source: "m.txt", Destination: "n.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(meta, mv.Metadata); d != "" {
		t.Fatalf("move metadata (-want +got):\n%s", d)
	}
	// A write replaces the set; one without metadata clears it.
	again, err := e.client.WriteFileMetadata(ctx, "n.txt", "", 0, map[string]string{"step": "4"}, bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{"step": "4"}, again.Metadata); d != "" {
		t.Fatalf("replaced metadata (-want +got):\n%s", d)
	}
	plain, err := e.client.WriteFile(ctx, "n.txt", "", 0, bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Metadata != nil {
		t.Fatalf("plain write kept metadata %v", plain.Metadata)
	}
	for _, bad := range []map[string]string{
		{"UPPER": "v"},
		{"k": "new\nline"},
		{strings.Repeat("k", agentapi.MaxMetadataKeyBytes+1): "v"},
		{"a": strings.Repeat("v", agentapi.MaxMetadataBytes)},
	} {
		if _, err := e.client.WriteFileMetadata(ctx, "bad.txt", "", 0, bad, strings.NewReader("x")); !errs.Is(err, errs.InvalidArgument) || !strings.HasPrefix(errs.FieldOf(err), "metadata.") {
			t.Errorf("metadata %.40v: err = %v (field %q), want InvalidArgument on metadata.*", bad, err, errs.FieldOf(err))
		}
	}
	// The agent checks on its own too (a client that skips the check).
	rawQ := `{"K":"v"}`
	if _, err := agentapi.DecodeMetadata(rawQ); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("agent accepted %s: %v", rawQ, err)
	}
}
