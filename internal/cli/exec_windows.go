package cli

import (
	"context"
	"io"

	"github.com/berth-dev/berth/client"
)

// forwardResize: Windows has no SIGWINCH; the terminal keeps the size it
// had when the command started.
func forwardResize(ctx context.Context, box *client.Sandbox, pid int, in io.Reader) {}
