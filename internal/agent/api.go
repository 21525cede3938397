package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"golang.org/x/sys/unix"
)

// The in-sandbox API (docs/STATE.md "Inside the sandbox"): the agent
// listens on a Unix socket inside the sandbox (any uid may connect) and
// forwards each request, unchanged but bounded, over a caller connection
// to the daemon, which acts as this sandbox. The socket lives in the
// sandbox's own filesystem, so its root may delete or replace it: the
// agent checks it every apiCheckEvery and re-creates it, through a
// directory it opened without following links.

// APISocketPath is where the in-sandbox API listens by default.
const APISocketPath = "/run/berth-agent/api.sock"

// apiCheckEvery is how often the agent checks its socket is still in place.
const apiCheckEvery = time.Second

// maxAPIConns bounds the local connections the agent serves at once (any
// process in the sandbox may connect; the daemon bounds them again).
const maxAPIConns = 64

// apiServer is the agent's in-sandbox API listener and forwarder.
type apiServer struct {
	path   string
	caller *agentapi.Caller
	log    func(msg string, args ...any)
	srv    *http.Server
	conns  chan struct{}

	mu       sync.Mutex
	ln       *net.UnixListener
	dirIno   uint64
	sockIno  uint64
	closed   bool
	stop     context.CancelFunc
	loopDone chan struct{}
}

func newAPIServer(path string, caller *agentapi.Caller, warn func(string, ...any)) *apiServer {
	s := &apiServer{path: path, caller: caller, log: warn, conns: make(chan struct{}, maxAPIConns)}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "berth", "berth"
		},
		Transport: caller,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				err = errs.Field("body", "exceeds %d bytes", agentapi.MaxCallerRequest)
			}
			writeError(w, err)
		},
	}
	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > agentapi.MaxCallerRequest {
				writeError(w, errs.Field("body", "exceeds %d bytes", agentapi.MaxCallerRequest))
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, agentapi.MaxCallerRequest)
			proxy.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    agentapi.MaxCallerRequest,
		IdleTimeout:       30 * time.Second,
	}
	return s
}

// start binds the socket and checks it in the background until close.
func (s *apiServer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stop, s.loopDone = cancel, make(chan struct{})
	if err := s.ensure(); err != nil {
		s.log("in-sandbox API socket", "path", s.path, "err", err)
	}
	go func() {
		defer close(s.loopDone)
		t := time.NewTicker(apiCheckEvery)
		defer t.Stop()
		last := ""
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := s.ensure(); err != nil && err.Error() != last {
				s.log("in-sandbox API socket", "path", s.path, "err", err)
				last = err.Error()
			} else if err == nil {
				last = ""
			}
		}
	}()
}

func (s *apiServer) close() {
	s.mu.Lock()
	s.closed = true
	ln := s.ln
	s.ln = nil
	s.mu.Unlock()
	if s.stop != nil {
		s.stop()
		<-s.loopDone
	}
	if ln != nil {
		ln.Close()
	}
	_ = s.srv.Close()
	s.caller.Quiesce()
}

// ensure (re)creates the socket unless the one this agent bound is still
// the entry at s.path: the directory is opened without following a link
// (a link or a non-directory there is removed), made root-owned 0755, and
// the socket checked and chmod-ed through the opened directory, so nothing
// a sandbox's users plant redirects the chmod.
func (s *apiServer) ensure() error { return s.bind(false) }

// rebind binds a fresh socket whatever is there (after a restore: a
// restored listener may no longer be reachable at its path).
func (s *apiServer) rebind() error { return s.bind(true) }

func (s *apiServer) bind(force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	dir, name := filepath.Split(s.path)
	dir = filepath.Clean(dir)
	parent, base := filepath.Split(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := openDirNoFollow(pfd, base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o7777 != 0o755 {
		// Someone else's directory (or a wider mode): make it ours.
		if err := unix.Fchown(fd, os.Geteuid(), os.Getegid()); err != nil {
			return err
		}
		if err := unix.Fchmod(fd, 0o755); err != nil {
			return err
		}
	}
	var sst unix.Stat_t
	if !force && s.ln != nil && st.Ino == s.dirIno &&
		unix.Fstatat(fd, name, &sst, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		sst.Mode&unix.S_IFMT == unix.S_IFSOCK && sst.Ino == s.sockIno {
		return nil // still ours
	}
	if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unlinkat(fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	// Bind by path, checked below through the opened directory: a name
	// under /proc/self/fd would be what CRIU rebinds on a restore (and
	// fails). Only the sandbox's root can change the directory meanwhile.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.path, Net: "unix"})
	if err != nil {
		return err
	}
	ln.SetUnlinkOnClose(false)
	if err := unix.Fstatat(fd, name, &sst, unix.AT_SYMLINK_NOFOLLOW); err != nil || sst.Mode&unix.S_IFMT != unix.S_IFSOCK {
		ln.Close()
		return errs.E(errs.Internal, "in-sandbox API socket did not appear in %s", dir)
	}
	// The directory is ours (root 0755): nobody else can put a link there.
	if err := unix.Fchmodat(fd, name, 0o666, 0); err != nil {
		ln.Close()
		return err
	}
	old := s.ln
	s.ln, s.dirIno, s.sockIno = ln, st.Ino, sst.Ino
	if old != nil {
		old.Close()
	}
	go func() { _ = s.srv.Serve(limitListener{ln, s.conns}) }()
	return nil
}

// openDirNoFollow opens name under pfd as a directory, replacing a link or
// a non-directory found there with a new directory.
func openDirNoFollow(pfd int, name string) (int, error) {
	for range 3 {
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			// Not every kernel refuses a link here (gVisor opened the
			// target): the entry itself must be the directory opened.
			var ent, got unix.Stat_t
			if unix.Fstatat(pfd, name, &ent, unix.AT_SYMLINK_NOFOLLOW) == nil && unix.Fstat(fd, &got) == nil &&
				ent.Mode&unix.S_IFMT == unix.S_IFDIR && ent.Dev == got.Dev && ent.Ino == got.Ino {
				return fd, nil
			}
			unix.Close(fd)
			err = unix.ELOOP
		}
		switch {
		case errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			if err := unix.Unlinkat(pfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, err
			}
		default:
			return -1, err
		}
		if err := unix.Mkdirat(pfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
	}
	return -1, errs.E(errs.Internal, "cannot create the in-sandbox API directory %s", name)
}

// limitListener serves at most cap(sem) connections at once; one beyond
// that is closed at once.
type limitListener struct {
	*net.UnixListener
	sem chan struct{}
}

func (l limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &releaseConn{Conn: c, sem: l.sem}, nil
		default:
			c.Close()
		}
	}
}

type releaseConn struct {
	net.Conn
	sem  chan struct{}
	once sync.Once
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.sem })
	return err
}
