package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

// TestBlobTravels: a layer imported from an arbitrary tar is copied to a
// second store through its blob, which hashes the same there; a flipped
// byte or an oversized blob stores nothing.
func TestBlobTravels(t *testing.T) {
	ctx := context.Background()
	a, b := openStore(t), openStore(t)
	data := mkTar(t, dir("./", 0o755), dir("etc/", 0o755), file("etc/os-release", "ID=test\n"), file("bin/sh", "#!x\n"),
		symlink("etc/link", "os-release"))
	l, err := a.ImportTar(ctx, bytes.NewReader(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	want, size, err := a.BlobDigest(ctx, l.Digest)
	if err != nil || size == 0 {
		t.Fatalf("blob digest: %q %d %v", want, size, err)
	}
	var blob bytes.Buffer
	if err := a.WriteBlob(ctx, &blob, l.Digest); err != nil {
		t.Fatal(err)
	}

	bad := bytes.Clone(blob.Bytes())
	i := bytes.Index(bad, []byte("ID=test"))
	bad[i] = 'X'
	_, err = b.ImportBlob(ctx, l.Digest, want, bytes.NewReader(bad), 1<<20)
	if !errors.Is(err, ErrBlobMismatch) || !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("tampered blob: %v", err)
	}
	if _, err := b.ImportBlob(ctx, l.Digest, want, bytes.NewReader(blob.Bytes()), int64(blob.Len()-1)); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("oversized blob: %v", err)
	}
	if b.HasLayer(l.Digest) {
		t.Fatal("a refused blob was stored")
	}
	if ents, _ := os.ReadDir(b.Dir()); len(ents) != 0 {
		t.Fatalf("leftovers after refused imports: %v", ents)
	}

	got, err := b.ImportBlob(ctx, l.Digest, want, bytes.NewReader(blob.Bytes()), 1<<20)
	if err != nil || got.Digest != l.Digest {
		t.Fatalf("import: %+v %v", got, err)
	}
	if c, err := os.ReadFile(filepath.Join(got.Path, "etc/os-release")); err != nil || string(c) != "ID=test\n" {
		t.Fatalf("copied file: %q %v", c, err)
	}
	again, _, err := b.BlobDigest(ctx, l.Digest)
	if err != nil || again != want {
		t.Fatalf("the copy's blob hashes to %s, the original's to %s (%v)", again, want, err)
	}
	if _, err := b.ImportBlob(ctx, "../etc", want, bytes.NewReader(nil), 1); !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("bad digest: %v", err)
	}
}
