//go:build !linux || clientonly

package main

import (
	"context"
	"io"

	"github.com/berth-dev/berth/internal/errs"
)

const nodeUsage = "node [...]   (Linux only: a berth daemon that is one node of a cluster)"

// runNode: a node runs sandboxes, which needs Linux (see runServe).
func runNode(ctx context.Context, args []string, stderr io.Writer) error {
	return errs.E(errs.NotImplemented, "berth node runs on Linux only, in a build with the server")
}
