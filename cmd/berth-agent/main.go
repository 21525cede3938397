// Command berth-agent is PID 1 inside every sandbox: it reaps zombies and
// serves the agent API (internal/agentapi) on a unix socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-dev/berth/internal/agent"
	"golang.org/x/sys/unix"
)

func main() {
	var cfg agent.Config
	var subreaper bool
	flag.StringVar(&cfg.SocketPath, "socket", os.Getenv("BERTH_AGENT_SOCKET"), "unix socket to serve on (default /run/berth/agent.sock)")
	flag.BoolVar(&subreaper, "subreaper", false, "reap orphaned descendants as a child subreaper (implied as PID 1)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Logger = log
	cfg.SandboxID = os.Getenv("BERTH_SANDBOX_ID")
	cfg.ReapAll = os.Getpid() == 1 || subreaper
	if subreaper && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "berth-agent: set child subreaper:", err)
			os.Exit(1)
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := agent.Run(ctx, cfg, sigs); err != nil {
		log.Error("berth-agent", "err", err)
		os.Exit(1)
	}
}
