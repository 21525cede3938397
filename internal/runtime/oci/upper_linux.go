package oci

import (
	"context"
	"os"
	"path/filepath"

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
	if _, err := o.exec(ctx, false, "tar rootfs-upper", id, "tar", "rootfs-upper", "--file", file, id); err != nil {
		_ = os.Remove(file)
		return err
	}
	return nil
}
