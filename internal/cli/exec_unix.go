//go:build !windows

package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/berth-dev/berth/client"
)

// forwardResize sends the terminal's new size on every SIGWINCH.
func forwardResize(ctx context.Context, box *client.Sandbox, pid int, in io.Reader) {
	f, ok := in.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			if cols, rows, err := term.GetSize(int(f.Fd())); err == nil {
				_ = box.Resize(ctx, pid, uint16(cols), uint16(rows))
			}
		}
	}
}
