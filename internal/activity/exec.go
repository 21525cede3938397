package activity

import (
	"sync"

	"github.com/berth-dev/berth/internal/agentapi"
)

// Observer is the agentapi.Observer of one sandbox's agent client.
func (s *Service) Observer(id string) agentapi.Observer { return sandboxObserver{s: s, id: id} }

type sandboxObserver struct {
	s  *Service
	id string
}

// actorAPI: execs and file changes come through the API (REST or E2B).
const actorAPI = "api"

func (o sandboxObserver) Exec(req agentapi.ExecRequest) agentapi.ExecObserver {
	argv := req.Argv
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	return &execTrace{s: o.s, id: o.id, d: Data{Argv: clipArgv(argv), User: clip(req.User, maxString),
		Cwd: clip(req.Cwd, maxString), TTY: req.TTY != nil, Started: o.s.cfg.Now().UTC()}}
}

func (o sandboxObserver) Input(pid, n int) {
	o.s.mu.Lock()
	t := o.s.live[liveKey{o.id, pid}]
	o.s.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		t.d.BytesIn += int64(n)
		t.mu.Unlock()
	}
}

func (o sandboxObserver) FileChanged(op, path, to string, size int64) {
	o.s.Record(o.id, KindFile, actorAPI, o.s.cfg.Now(), Data{Op: op, Path: clip(path, maxString),
		To: clip(to, maxString), Size: size, Source: "api"})
}

// execTrace follows one exec stream and records it once, at its end.
type execTrace struct {
	s  *Service
	id string

	mu   sync.Mutex
	d    Data
	done bool
}

func (t *execTrace) Event(ev *agentapi.Event) {
	switch ev.Type {
	case "start":
		t.mu.Lock()
		t.d.Pid = ev.Pid
		t.mu.Unlock()
		t.s.mu.Lock()
		t.s.live[liveKey{t.id, ev.Pid}] = t
		t.s.mu.Unlock()
	case "stdout", "stderr", "pty":
		t.mu.Lock()
		t.d.BytesOut += int64(len(ev.Data))
		t.mu.Unlock()
	case "error":
		t.mu.Lock()
		t.d.Error = clip(ev.Error, maxString)
		t.mu.Unlock()
	case "exit":
		t.finish(func(d *Data) {
			if ev.Signal != "" {
				d.Signal = clip(ev.Signal, 64)
			} else {
				code := ev.ExitCode
				d.ExitCode = &code
			}
			if ev.Error != "" {
				d.Error = clip(ev.Error, maxString)
			}
		})
	}
}

// Closed records a stream that ended before its exit event as detached.
func (t *execTrace) Closed() { t.finish(func(d *Data) { d.Detached = true }) }

func (t *execTrace) finish(set func(*Data)) {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return
	}
	t.done = true
	set(&t.d)
	t.d.Ended = t.s.cfg.Now().UTC()
	d := t.d
	t.mu.Unlock()
	if d.Pid != 0 {
		t.s.mu.Lock()
		if t.s.live[liveKey{t.id, d.Pid}] == t {
			delete(t.s.live, liveKey{t.id, d.Pid})
		}
		t.s.mu.Unlock()
	}
	t.s.Record(t.id, KindExec, actorAPI, d.Ended, d)
}
