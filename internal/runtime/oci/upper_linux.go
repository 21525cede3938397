package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// ExportUpper writes container id's root filesystem changes as a tar of an
// overlay upper dir (whiteouts as char 0/0, opaque dirs as the
// trusted.overlay.opaque xattr) to file. runsc keeps a sandbox's rootfs
// writes in its own in-sandbox overlay, not in the host's upper dir, so a
// capture has to ask it (`runsc tar rootfs-upper`). runc writes straight to
// the host upper dir, which the caller copies itself: NotImplemented.
func (o *OCI) ExportUpper(ctx context.Context, id, file string) error {
	if o.name != Runsc {
		return errs.E(errs.NotImplemented, "%s writes to the host upper dir; copy it", o.name)
	}
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	if !filepath.IsAbs(file) {
		return errs.Field("file", "must be an absolute path, got %q", file)
	}
	if o.hostUpper() {
		// What runsc would answer (callers match "not an overlayfs"),
		// without a runsc process per capture or view.
		return errs.E(errs.NotImplemented, "runsc runs with --overlay2=none: the root filesystem is not an overlayfs; its writes are in the host upper dir")
	}
	if _, err := o.exec(ctx, false, "tar rootfs-upper", id, "tar", "rootfs-upper", "--file", file, id); err != nil {
		_ = os.Remove(file)
		return err
	}
	return nil
}

// hostUpper says that runsc writes a container's rootfs changes through to
// the host upper dir: berth passes --overlay2=none, and no RunscFlags entry
// after it asks for another overlay.
func (o *OCI) hostUpper() bool {
	none := true
	for _, f := range o.cfg.RunscFlags {
		if v, ok := strings.CutPrefix(strings.TrimLeft(f, "-"), "overlay2="); ok {
			none = v == "none"
		} else if f == "--overlay2" || f == "-overlay2" {
			none = false // value in the next argument: ask runsc
		}
	}
	return none
}
