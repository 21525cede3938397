// Package agent is berth-agent: PID 1 inside every sandbox. It serves the
// internal/agentapi contract on a unix socket: exec with streams, stdin,
// signals and PTYs; files; watches; health and activity for the reaper; and
// quiesce/reopen around memory checkpoints.
package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// Version is reported by /health.
const Version = "0.1.0"

// DefaultPath is the PATH every process starts with (lowest precedence).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config is the agent's configuration. Zero values take the in-sandbox
// defaults; tests point the paths at temporary files.
type Config struct {
	SocketPath       string // default /run/berth/agent.sock
	PasswdPath       string // default /etc/passwd
	GroupPath        string // default /etc/group
	EnvFile          string // default /run/berth/env.json: default env for every process
	HookDir          string // default /etc/berth/on-restore.d
	HookLog          string // default /run/berth/on-restore.log
	RestoreCountFile string // default /run/berth/restore-count
	SandboxID        string // exported to every process as BERTH_SANDBOX_ID
	// ReapAll makes the agent reap every child with wait4(-1), as PID 1 (or a
	// child subreaper) must. Off, it waits only for the processes it started.
	ReapAll bool
	Logger  *slog.Logger
}

func (c *Config) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.SocketPath, filepath.Join(agentapi.SocketDir, agentapi.SocketName))
	def(&c.PasswdPath, "/etc/passwd")
	def(&c.GroupPath, "/etc/group")
	def(&c.EnvFile, filepath.Join(agentapi.SocketDir, "env.json"))
	def(&c.HookDir, "/etc/berth/on-restore.d")
	def(&c.HookLog, filepath.Join(agentapi.SocketDir, "on-restore.log"))
	def(&c.RestoreCountFile, filepath.Join(agentapi.SocketDir, "restore-count"))
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}

// Agent serves the agent API. Create with New, then Listen; Quiesce and
// Listen again around a checkpoint; Close at the end.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	boot     time.Time
	children *childWaiter
	handler  http.Handler

	mu        sync.Mutex
	procs     map[int]*process
	srv       *http.Server
	serveDone chan struct{}
	closed    bool

	restoreCount atomic.Int64
	lastExec     atomic.Int64 // unix nanos
	lastWrite    atomic.Int64
	running      atomic.Int64
	openStreams  atomic.Int64

	// forkID is BERTH_SANDBOX_ID after a restore as a fork (the image has the parent's).
	forkID atomic.Pointer[string]

	procWG sync.WaitGroup // process lifecycles
}

// New builds an agent; it does not listen yet.
func New(cfg Config) *Agent {
	cfg.setDefaults()
	a := &Agent{
		cfg:      cfg,
		log:      cfg.Logger,
		boot:     time.Now(),
		children: newChildWaiter(cfg.ReapAll, cfg.Logger),
		procs:    map[int]*process{},
	}
	a.handler = a.routes()
	return a
}

// Handler is the HTTP handler serving every agentapi route.
func (a *Agent) Handler() http.Handler { return a.handler }

func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", a.handleHealth)
	mux.HandleFunc("GET /activity", a.handleActivity)
	mux.HandleFunc("POST /exec", a.handleExec)
	mux.HandleFunc("GET /processes", a.handleProcesses)
	mux.HandleFunc("POST /processes/{pid}/attach", a.handleAttach)
	mux.HandleFunc("POST /processes/{pid}/input", a.handleInput)
	mux.HandleFunc("POST /processes/{pid}/close-stdin", a.handleCloseStdin)
	mux.HandleFunc("POST /processes/{pid}/signal", a.handleSignal)
	mux.HandleFunc("POST /processes/{pid}/resize", a.handleResize)
	mux.HandleFunc("GET /files", a.handleReadFile)
	mux.HandleFunc("PUT /files", a.handleWriteFile)
	mux.HandleFunc("POST /fs/stat", a.handleStat)
	mux.HandleFunc("POST /fs/list", a.handleList)
	mux.HandleFunc("POST /fs/mkdir", a.handleMkdir)
	mux.HandleFunc("POST /fs/move", a.handleMove)
	mux.HandleFunc("POST /fs/remove", a.handleRemove)
	mux.HandleFunc("POST /fs/watch", a.handleWatch)
	mux.HandleFunc("POST /restored", a.handleRestored)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.E(errs.NotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// Listen binds the socket (replacing a stale one) and serves in the background.
func (a *Agent) Listen() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errs.E(errs.FailedPrecondition, "agent is closed")
	}
	if a.srv != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(a.cfg.SocketPath), 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "create socket dir")
	}
	if err := os.Remove(a.cfg.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errs.Wrap(errs.Internal, err, "remove stale socket")
	}
	ln, err := net.Listen("unix", a.cfg.SocketPath)
	if err != nil {
		return errs.Wrap(errs.Unavailable, err, "listen on %s", a.cfg.SocketPath)
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	a.srv, a.serveDone = srv, done
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("serve", "err", err)
		}
	}()
	a.log.Info("listening", "socket", a.cfg.SocketPath)
	return nil
}

// Quiesce closes the listener and every connection (open streams end) so a
// checkpoint can be taken; processes keep running.
func (a *Agent) Quiesce() {
	a.mu.Lock()
	srv, done := a.srv, a.serveDone
	a.srv, a.serveDone = nil, nil
	a.mu.Unlock()
	if srv == nil {
		return
	}
	_ = srv.Close()
	<-done
	a.log.Info("quiesced")
}

// Close stops serving, kills every process the agent started and waits for
// all of its goroutines to end.
func (a *Agent) Close() error {
	a.Quiesce()
	a.mu.Lock()
	a.closed = true
	var live []*process
	for _, p := range a.procs {
		live = append(live, p)
	}
	a.mu.Unlock()
	for _, p := range live {
		if !p.isFinished() {
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	}
	a.procWG.Wait()
	a.children.close()
	return nil
}

// Run serves until ctx ends: SIGUSR1 quiesces, SIGUSR2 listens again.
func Run(ctx context.Context, cfg Config, signals <-chan os.Signal) error {
	a := New(cfg)
	defer a.Close()
	if err := a.Listen(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case sig := <-signals:
			switch sig {
			case syscall.SIGUSR1:
				a.Quiesce()
			case syscall.SIGUSR2:
				if err := a.Listen(); err != nil {
					a.log.Error("listen after quiesce", "err", err)
				}
			}
		}
	}
}

func (a *Agent) users() (*userDB, error) {
	return readUserDB(a.cfg.PasswdPath, a.cfg.GroupPath)
}

// account resolves the request's user name against the current passwd.
func (a *Agent) account(name string) (account, *userDB, error) {
	db, err := a.users()
	if err != nil {
		return account{}, nil, err
	}
	acct, err := db.lookup(name)
	return acct, db, err
}

func (a *Agent) lookupProcess(r *http.Request) (*process, error) {
	pid, err := pidParam(r)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pruneLocked(time.Now())
	p, ok := a.procs[pid]
	if !ok {
		return nil, errs.E(errs.NotFound, "process %d not found", pid)
	}
	return p, nil
}

// pruneLocked forgets exited processes whose result is older than retainExited.
func (a *Agent) pruneLocked(now time.Time) {
	for pid, p := range a.procs {
		p.mu.Lock()
		old := p.finished && now.Sub(p.ended) > retainExited
		p.mu.Unlock()
		if old {
			delete(a.procs, pid)
		}
	}
}

func (a *Agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, agentapi.Health{OK: true, Version: Version, BootTime: a.boot,
		RestoreCount: int(a.restoreCount.Load())})
}

func (a *Agent) handleActivity(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, agentapi.Activity{
		LastExec:      unixNanoTime(a.lastExec.Load()),
		LastFileWrite: unixNanoTime(a.lastWrite.Load()),
		Running:       int(a.running.Load()),
		OpenStreams:   int(a.openStreams.Load()),
	})
}

func unixNanoTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
