package agent

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// childWaiter starts child processes and delivers each one's wait status to
// whoever started it. As PID 1 (reapAll) a single loop reaps every child with
// wait4(-1) on SIGCHLD — orphans reparented to us included — and dispatches
// statuses by pid; the agent never uses os/exec there, which would race that
// loop for exit statuses. Outside PID 1 (tests) each child is waited for by pid.
type childWaiter struct {
	reapAll bool
	log     *slog.Logger

	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus

	sigs chan os.Signal
	stop chan struct{}
	done chan struct{}
}

func newChildWaiter(reapAll bool, log *slog.Logger) *childWaiter {
	w := &childWaiter{reapAll: reapAll, log: log, waiting: map[int]chan syscall.WaitStatus{}}
	if reapAll {
		w.sigs = make(chan os.Signal, 1)
		w.stop = make(chan struct{})
		w.done = make(chan struct{})
		signal.Notify(w.sigs, syscall.SIGCHLD)
		go w.loop()
	}
	return w
}

func (w *childWaiter) loop() {
	defer close(w.done)
	for {
		w.reap()
		select {
		case <-w.sigs:
		case <-w.stop:
			return
		}
	}
}

// reap collects every exited child without blocking.
func (w *childWaiter) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		// start holds mu across fork+register, so a pid reaped here is either
		// registered already or was never ours (an orphan).
		w.mu.Lock()
		ch, ok := w.waiting[pid]
		delete(w.waiting, pid)
		w.mu.Unlock()
		if ok {
			ch <- ws
		} else {
			w.log.Debug("reaped orphan", "pid", pid, "status", ws)
		}
	}
}

// start forks and execs argv0; the returned channel receives its wait status once.
func (w *childWaiter) start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	if w.reapAll {
		w.waiting[pid] = ch
		return pid, ch, nil
	}
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			break
		}
		ch <- ws
	}()
	return pid, ch, nil
}

func (w *childWaiter) close() {
	if w.reapAll {
		signal.Stop(w.sigs)
		close(w.stop)
		<-w.done
	}
}
