// Package agent is berth-agent: PID 1 inside every sandbox. It dials the
// daemon's channel socket, authenticates with the sandbox's key, and serves
// the internal/agentapi contract over that channel: exec with streams, stdin,
// signals and PTYs; files; watches; health and activity for the reaper; and
// quiesce/reopen around memory checkpoints.
package agent

import (
	"context"
	"log/slog"
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
	SocketPath       string // default /run/berth/agent.sock: the daemon's channel socket, dialed
	PasswdPath       string // default /etc/passwd
	GroupPath        string // default /etc/group
	EnvFile          string // default /run/berth/env.json: default env for every process (host-written, read-only here)
	HookDir          string // default /etc/berth/on-restore.d
	HookLog          string // default /var/lib/berth-agent/on-restore.log (the sandbox's own disk)
	RestoreCountFile string // default /var/lib/berth-agent/restore-count
	SandboxID        string // exported to every process as BERTH_SANDBOX_ID; the channel identity
	// APISocket is where the in-sandbox API listens (api.go; berth-agent's
	// default APISocketPath), exported to every process as BERTH_API_SOCKET.
	// Empty: no in-sandbox API (unit tests on the host).
	APISocket string
	Key       []byte // the sandbox's channel key (agentapi.KeySize bytes)
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
	def(&c.HookLog, filepath.Join(StateDir, "on-restore.log"))
	def(&c.RestoreCountFile, filepath.Join(StateDir, "restore-count"))
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}

// StateDir holds the agent's own files inside the sandbox's filesystem (so
// they survive a disk pause, and nothing of them lands on the host).
const StateDir = "/var/lib/berth-agent"

// Agent serves the agent API. Create with New, then Listen (dial the
// daemon); Quiesce and Listen again around a checkpoint; Close at the end.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	boot     time.Time
	children *childWaiter
	handler  http.Handler

	mu     sync.Mutex
	procs  map[int]*process
	uplink *agentapi.Uplink
	api    *apiServer // the in-sandbox API (api.go), nil without cfg.APISocket
	closed bool

	restoreCount atomic.Int64
	lastExec     atomic.Int64 // unix nanos
	lastWrite    atomic.Int64
	running      atomic.Int64
	openStreams  atomic.Int64

	// forkID is BERTH_SANDBOX_ID after a restore as a fork (the image has
	// the parent's), forkKey its channel key.
	forkID  atomic.Pointer[string]
	forkKey atomic.Pointer[[]byte]

	procWG sync.WaitGroup // process lifecycles

	// What every exec reads, kept while the files are unchanged (filecache.go).
	userCache versionedCache[*userDB]
	envCache  versionedCache[map[string]string] // renamed: set in New
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
	a.envCache.renamed = true // the daemon replaces env.json by rename only
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
	mux.HandleFunc("POST /files/batch", a.handleWriteBatch)
	mux.HandleFunc("GET /files/batch", a.handleReadBatch)
	mux.HandleFunc("POST /fs/stat", a.handleStat)
	mux.HandleFunc("POST /fs/list", a.handleList)
	mux.HandleFunc("POST /fs/mkdir", a.handleMkdir)
	mux.HandleFunc("POST /fs/move", a.handleMove)
	mux.HandleFunc("POST /fs/remove", a.handleRemove)
	mux.HandleFunc("POST /fs/watch", a.handleWatch)
	mux.HandleFunc("POST /restored", a.handleRestored)
	mux.HandleFunc("POST /quiesce", a.handleQuiesce)
	a.mergeRoutes(mux) // merge.go: applying a merge where only the agent can write
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.E(errs.NotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// identity is who the agent says it is on the channel.
func (a *Agent) identity() (string, []byte) {
	id, key := a.cfg.SandboxID, a.cfg.Key
	if p := a.forkID.Load(); p != nil {
		id = *p
	}
	if p := a.forkKey.Load(); p != nil {
		key = *p
	}
	return id, key
}

// Listen starts dialing the daemon's channel socket in the background
// (redialing whenever its connections drop) and serves the API on them.
func (a *Agent) Listen() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errs.E(errs.FailedPrecondition, "agent is closed")
	}
	if a.uplink != nil {
		return nil
	}
	if len(a.cfg.Key) != agentapi.KeySize {
		return errs.Field("key", "the channel key must be %d bytes (BERTH_AGENT_KEY)", agentapi.KeySize)
	}
	a.uplink = agentapi.DialUplink(a.cfg.SocketPath, a.identity, a.handler, a.log)
	a.log.Info("dialing", "socket", a.cfg.SocketPath)
	if a.cfg.APISocket != "" {
		if a.api == nil {
			a.api = newAPIServer(a.cfg.APISocket, agentapi.NewCaller(a.cfg.SocketPath, a.identity), a.log.Warn)
			a.api.start()
		} else {
			a.api.caller.Reopen()
			if err := a.api.rebind(); err != nil { // after a restore: a fresh socket at once
				a.log.Warn("in-sandbox API socket", "path", a.cfg.APISocket, "err", err)
			}
		}
	}
	return nil
}

// Quiesce closes the channel (open streams end) and stops dialing, so a
// checkpoint can be taken; processes keep running.
func (a *Agent) Quiesce() {
	a.mu.Lock()
	up := a.uplink
	a.uplink = nil
	api := a.api
	a.mu.Unlock()
	if api != nil {
		api.caller.Quiesce() // its local socket stays: it is not the host's
	}
	if up == nil {
		return
	}
	up.Close()
	a.log.Info("quiesced")
}

// handleQuiesce answers, then quiesces: the daemon waits for the connections
// to close, which is the agent's acknowledgement.
func (a *Agent) handleQuiesce(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
	_ = http.NewResponseController(w).Flush()
	go a.Quiesce()
}

// Close stops serving, kills every process the agent started and waits for
// all of its goroutines to end.
func (a *Agent) Close() error {
	a.Quiesce()
	a.mu.Lock()
	a.closed = true
	api := a.api
	a.api = nil
	var live []*process
	for _, p := range a.procs {
		live = append(live, p)
	}
	a.mu.Unlock()
	if api != nil {
		api.close()
	}
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
	return a.userCache.get(time.Now(), []string{a.cfg.PasswdPath, a.cfg.GroupPath}, func() (*userDB, error) {
		return readUserDB(a.cfg.PasswdPath, a.cfg.GroupPath)
	})
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
