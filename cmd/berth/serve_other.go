//go:build !linux || clientonly

package main

import (
	"context"
	"io"
	"runtime"

	"github.com/berth-dev/berth/internal/errs"
)

// runServe: the server needs Linux (namespaces, cgroups, overlayfs); the
// CLI on this system talks to one elsewhere (BERTH_URL). `-tags clientonly`
// builds this client-only binary on Linux too.
func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	if runtime.GOOS == "linux" {
		return errs.E(errs.NotImplemented, "this berth is a client-only build (-tags clientonly): berth serve is not in it")
	}
	return errs.E(errs.NotImplemented, "berth serve runs on Linux only (this is %s/%s); point BERTH_URL at a Linux host running it", runtime.GOOS, runtime.GOARCH)
}
