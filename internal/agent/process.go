package agent

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"golang.org/x/sys/unix"
)

const (
	// retainExited is how long an exited process's result stays attachable.
	retainExited = 60 * time.Second
	// drainGrace bounds how long output is still read after the process
	// exits, for children that inherited its stdout and outlive it.
	drainGrace = 2 * time.Second
	readChunk  = 32 << 10
	subBuffer  = 16
)

// process is one command started through /exec. Its output fans out to
// subscribers (the exec stream and any attach streams). Delivery blocks on a
// slow subscriber instead of dropping, which in turn stops reading from the
// pipe: memory stays bounded and nothing is lost.
type process struct {
	pid  int
	info agentapi.ProcessInfo

	outputs []*os.File // read ends (pipes or the pty master)
	pty     *os.File

	pubMu sync.Mutex // serializes publishers so every subscriber sees one order

	mu       sync.Mutex // guards the fields below up to timedOut
	stdin    *os.File
	subs     map[*subscriber]struct{}
	finished bool
	ended    time.Time
	result   agentapi.Event

	// When the wait status came and when the output was read to EOF.
	exitedAt, drainedAt time.Time

	timedOut atomic.Bool
	done     chan struct{}
}

type subscriber struct {
	ch   chan agentapi.Event
	gone chan struct{}
	once sync.Once
}

func newProcess(info agentapi.ProcessInfo) *process {
	return &process{info: info, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
}

// subscribe returns a subscriber for new output, or finished=true with the
// exit event if the process already ended.
func (p *process) subscribe() (*subscriber, bool, agentapi.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return nil, true, p.result
	}
	s := &subscriber{ch: make(chan agentapi.Event, subBuffer), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, false, agentapi.Event{}
}

func (p *process) unsubscribe(s *subscriber) {
	s.once.Do(func() { close(s.gone) })
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

func (p *process) publish(ev agentapi.Event) {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// finish records the exit event, hands it to every subscriber and closes them.
func (p *process) finish(ev agentapi.Event) {
	p.pubMu.Lock()
	p.mu.Lock()
	p.finished = true
	p.ended = time.Now()
	p.result = ev
	subs := p.subs
	p.subs = nil
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
	for s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
		close(s.ch)
	}
	p.pubMu.Unlock()
	close(p.done)
}

func (p *process) isFinished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.finished
}

// read copies one output file into events until EOF (or EIO from a pty
// whose slave side is gone).
func (p *process) read(f *os.File, typ string) {
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.publish(agentapi.Event{Type: typ, Data: append([]byte(nil), buf[:n]...)})
		}
		if err != nil {
			return
		}
	}
}

// run drives the process to its end: reads output, waits for the status,
// and publishes exactly one exit event.
func (p *process) run(exited <-chan syscall.WaitStatus, timeout time.Duration, onEnd func()) {
	var readers sync.WaitGroup
	types := []string{"stdout", "stderr"}
	if p.pty != nil {
		types = []string{"pty"}
	}
	for i, f := range p.outputs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			p.read(f, types[i])
		}()
	}
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() {
			p.timedOut.Store(true)
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		})
	}
	ws := <-exited
	exitedAt := time.Now()
	if timer != nil {
		timer.Stop()
	}
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	default:
		// A timer only when the output is not at EOF yet: arming one can
		// wake the poller, a Sentry trip under gVisor on every exec.
		t := time.NewTimer(drainGrace)
		select {
		case <-drained:
		case <-t.C:
			for _, f := range p.outputs {
				f.Close()
			}
			<-drained
		}
		t.Stop()
	}
	for _, f := range p.outputs {
		f.Close()
	}
	p.mu.Lock()
	p.exitedAt, p.drainedAt = exitedAt, time.Now()
	p.mu.Unlock()
	onEnd()
	p.finish(exitEvent(p.pid, ws, p.timedOut.Load()))
}

// exitTimes returns exitedAt and drainedAt (zero while it still runs).
func (p *process) exitTimes() (exited, drained time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitedAt, p.drainedAt
}

// exitEvent renders a wait status the way os/exec's ProcessState does.
func exitEvent(pid int, ws syscall.WaitStatus, timedOut bool) agentapi.Event {
	ev := agentapi.Event{Type: "exit", Pid: pid}
	switch {
	case ws.Exited():
		ev.Exited = true
		ev.ExitCode = ws.ExitStatus()
		ev.Status = "exit status " + strconv.Itoa(ev.ExitCode)
		if ev.ExitCode != 0 {
			ev.Error = ev.Status
		}
	case ws.Signaled():
		ev.ExitCode = -1
		ev.Signal = ws.Signal().String()
		ev.Status = "signal: " + ev.Signal
		if ws.CoreDump() {
			ev.Status += " (core dumped)"
		}
		ev.Error = ev.Status
	default:
		ev.ExitCode = -1
		ev.Status = "unknown status"
		ev.Error = ev.Status
	}
	if timedOut {
		ev.Error = "timeout"
	}
	return ev
}

func (p *process) writeInput(data []byte) error {
	if p.pty != nil {
		_, err := p.pty.Write(data)
		return err
	}
	p.mu.Lock()
	f := p.stdin
	p.mu.Unlock()
	if f == nil {
		return errStdinClosed
	}
	_, err := f.Write(data)
	if errors.Is(err, os.ErrClosed) {
		return errStdinClosed
	}
	return err
}

var errStdinClosed = errors.New("stdin is not open")

func (p *process) closeStdin() error {
	if p.pty != nil {
		// A terminal has no separate stdin; EOF is the VEOF character.
		_, err := p.pty.Write([]byte{4})
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *process) resize(cols, rows uint16) error {
	if p.pty == nil {
		return errNoTTY
	}
	rc, err := p.pty.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	err = rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
	if err != nil {
		return err
	}
	return ierr
}

var errNoTTY = errors.New("process has no terminal")
