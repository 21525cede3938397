// Command berth is the berth server (`berth serve`, Linux only) and its CLI.
// This package is the composition root: main wires `serve` (serve_linux.go)
// into the CLI's verbs, which talk to a server only through the public
// client and so build for every GOOS.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-dev/berth/internal/cli"
)

func main() {
	cli.RegisterDaemon("node", nodeUsage, runNode) // node_linux.go
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, runServe)
	stop()
	os.Exit(code)
}
