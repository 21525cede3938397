package agent

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// hookTimeout bounds one on-restore hook; a hung hook is killed.
const hookTimeout = 60 * time.Second

// handleRestored records the restore count (exported to later processes as
// BERTH_RESTORE_COUNT) and runs the on-restore hooks before answering.
func (a *Agent) handleRestored(w http.ResponseWriter, r *http.Request) {
	var req agentapi.RestoredRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.RestoreCount < 0 {
		writeError(w, errs.Field("restore_count", "must be >= 0, got %d", req.RestoreCount))
		return
	}
	var key []byte
	if req.Key != "" {
		k, err := hex.DecodeString(req.Key)
		if err != nil || len(k) != agentapi.KeySize || req.SandboxID == "" {
			writeError(w, errs.Field("key", "must be %d hex-encoded bytes, with sandbox_id", agentapi.KeySize))
			return
		}
		key = k
	}
	a.restoreCount.Store(int64(req.RestoreCount))
	if req.SandboxID != "" {
		id := req.SandboxID
		a.forkID.Store(&id)
	}
	if key != nil { // a fork's own key: used from the next connection on
		a.forkKey.Store(&key)
	}
	if err := os.MkdirAll(filepath.Dir(a.cfg.RestoreCountFile), 0o755); err == nil {
		if err := os.WriteFile(a.cfg.RestoreCountFile, []byte(strconv.Itoa(req.RestoreCount)+"\n"), 0o644); err != nil {
			a.log.Warn("write restore count", "path", a.cfg.RestoreCountFile, "err", err)
		}
	}
	a.log.Info("restored", "restore_count", req.RestoreCount, "host_time", req.HostTime)
	if err := a.runRestoreHooks(); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// runRestoreHooks runs every executable in HookDir in name order, as root,
// appending their output to HookLog. A failing hook is logged, not fatal.
func (a *Agent) runRestoreHooks() error {
	entries, err := os.ReadDir(a.cfg.HookDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return errs.Wrap(errs.Internal, err, "read %s", a.cfg.HookDir)
	}
	if err := os.MkdirAll(filepath.Dir(a.cfg.HookLog), 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "create hook log dir")
	}
	logf, err := os.OpenFile(a.cfg.HookLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open %s", a.cfg.HookLog)
	}
	defer logf.Close()
	db, err := a.users()
	if err != nil {
		return err
	}
	root, ok := db.find("root")
	if !ok {
		root = account{Name: "root", Home: "/root", Groups: []int{0}}
	}
	for _, e := range entries {
		path := filepath.Join(a.cfg.HookDir, e.Name())
		if !isExecutable(path) {
			continue
		}
		fmt.Fprintf(logf, "== %s %s\n", time.Now().UTC().Format(time.RFC3339), e.Name())
		status, err := a.runHook(path, root, logf)
		if err != nil {
			fmt.Fprintf(logf, "== %s: %v\n", e.Name(), err)
			a.log.Warn("restore hook", "hook", path, "err", err)
			continue
		}
		fmt.Fprintf(logf, "== %s: %s\n", e.Name(), status)
		a.log.Info("restore hook", "hook", path, "status", status)
	}
	return nil
}

func (a *Agent) runHook(path string, root account, logf *os.File) (string, error) {
	env, err := a.buildEnv(root, nil, false)
	if err != nil {
		return "", err
	}
	cred, err := credential(root)
	if err != nil {
		return "", err
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return "", err
	}
	defer null.Close()
	dir := root.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	pid, exited, err := a.children.start(path, []string{path}, &syscall.ProcAttr{
		Dir: dir, Env: envList(env), Files: []uintptr{null.Fd(), logf.Fd(), logf.Fd()},
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	})
	if err != nil {
		return "", err
	}
	timer := time.NewTimer(hookTimeout)
	defer timer.Stop()
	select {
	case ws := <-exited:
		return exitEvent(pid, ws, false).Status, nil
	case <-timer.C:
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		ws := <-exited
		return exitEvent(pid, ws, true).Status + " (timeout)", nil
	}
}
