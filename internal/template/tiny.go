package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
)

// tinyEpoch is the mtime of every file in the tiny tar, so that the tar —
// and the layer digest — depend only on the busybox binary and the layout.
var tinyEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// BuildTiny packs a busybox rootfs (rootfs.BusyboxRootFS: static busybox,
// applet symlinks, root and user 1000) into cacheDir/tiny-<digest>.tar and
// returns its path. It takes about a second, so it is rebuilt every time;
// the tar is reproducible (fixed mtimes, lexical order), so rebuilding yields
// the same file name and the same layer digest. Needs root (ownership).
func BuildTiny(ctx context.Context, cacheDir string, progress func(Progress)) (string, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	if cacheDir == "" {
		return "", errs.Field("cache_dir", "must not be empty")
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create cache dir")
	}
	work, err := os.MkdirTemp(cacheDir, "tiny-*.build")
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "create build dir")
	}
	defer os.RemoveAll(work)
	dir := filepath.Join(work, "rootfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create build dir")
	}
	progress(Progress{Phase: PhaseInstall, Message: "building busybox rootfs"})
	if err := rootfs.BusyboxRootFS(dir); err != nil {
		return "", err
	}
	tmpTar := filepath.Join(work, "tiny.tar")
	if err := writeTarFile(ctx, dir, tmpTar, packOptions{fixedTime: &tinyEpoch}, progress); err != nil {
		return "", err
	}
	b, err := os.ReadFile(tmpTar + ".sha256")
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "read digest")
	}
	digest := strings.TrimSpace(string(b))
	tarPath := filepath.Join(cacheDir, "tiny-"+digest[:16]+".tar")
	if fileExists(tarPath) {
		progress(Progress{Phase: PhaseCached, Message: "using cached " + tarPath})
		return tarPath, nil
	}
	// Digest file first: a tar is only trusted with its digest beside it.
	if err := os.Rename(tmpTar+".sha256", tarPath+".sha256"); err != nil {
		return "", errs.Wrap(errs.Internal, err, "move digest into place")
	}
	if err := os.Rename(tmpTar, tarPath); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", errs.Wrap(errs.Internal, err, "move tar into place")
	}
	fi, _ := os.Stat(tarPath)
	progress(Progress{Phase: PhasePack, Message: fmt.Sprintf("packed %s (%d KiB)", tarPath, fi.Size()>>10), Bytes: fi.Size()})
	return tarPath, nil
}
