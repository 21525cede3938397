// Command berth-agent is PID 1 inside every sandbox: it reaps zombies and
// serves the agent API (internal/agentapi) over the daemon's authenticated
// channel socket. The channel key comes in BERTH_AGENT_KEY (hex), set by
// the daemon in PID 1's environment; no process the agent starts inherits it.
//
// `berth-agent api METHOD PATH [JSON|-]` is the client of the in-sandbox API
// (api.go), for any process in the sandbox.
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "api" {
		os.Exit(runAPI(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	var cfg agent.Config
	var subreaper bool
	var runDir, stateDir string
	flag.StringVar(&cfg.SocketPath, "socket", os.Getenv("BERTH_AGENT_SOCKET"), "the daemon's channel socket to dial (default RUN-DIR/agent.sock)")
	flag.StringVar(&runDir, "run-dir", agentapi.SocketDir, "read-only directory from the host: agent.sock, env.json")
	flag.StringVar(&stateDir, "state-dir", agent.StateDir, "the agent's own files in the sandbox: on-restore.log, restore-count")
	flag.StringVar(&cfg.HookDir, "hook-dir", "/etc/berth/on-restore.d", "executables run after a memory restore")
	flag.StringVar(&cfg.APISocket, "api-socket", agent.APISocketPath, "where the in-sandbox API listens (empty: none)")
	flag.BoolVar(&subreaper, "subreaper", false, "reap orphaned descendants as a child subreaper (implied as PID 1)")
	flag.Parse()
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(runDir, agentapi.SocketName)
	}
	cfg.EnvFile = filepath.Join(runDir, "env.json")
	cfg.HookLog = filepath.Join(stateDir, "on-restore.log")
	cfg.RestoreCountFile = filepath.Join(stateDir, "restore-count")
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Logger = log
	cfg.SandboxID = os.Getenv("BERTH_SANDBOX_ID")
	key, err := hex.DecodeString(os.Getenv("BERTH_AGENT_KEY"))
	if err != nil || len(key) != agentapi.KeySize {
		fmt.Fprintf(os.Stderr, "berth-agent: BERTH_AGENT_KEY must be %d hex-encoded bytes\n", agentapi.KeySize)
		os.Exit(2)
	}
	cfg.Key = key
	_ = os.Unsetenv("BERTH_AGENT_KEY")
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
