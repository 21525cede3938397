package agent

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The agent's side of a merge into a sandbox whose tree the host cannot
// write (runsc): stage, stop the other processes (a cgroup freeze would
// stop the agent too), commit with renames, finish. The daemon keeps the
// journal; every step here can be repeated.

// mergeRoot is the tree merges are applied beneath.
const mergeRoot = "/"

// Bounds of what the daemon may send and what the scan reads.
const (
	maxMergeJournal = 64 << 20
	maxScanProcs    = 4096
	maxScanFDs      = 4096
	maxOpenReported = 256
)

// mergeStops are the processes the agent stopped for a merge.
type mergeStops struct {
	mu   sync.Mutex
	pids map[int]bool
}

var stops = &mergeStops{pids: map[int]bool{}}

func (a *Agent) mergeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /merge/stage", a.handleMergeStage)
	mux.HandleFunc("POST /merge/stop", a.handleMergeStop)
	mux.HandleFunc("POST /merge/commit", a.handleMergeCommit)
	mux.HandleFunc("POST /merge/finish", a.handleMergeFinish)
}

func checkJournal(j *merge.Journal) error {
	if !sandbox.ValidID(j.ID) || j.Staging != ".berth-merge-"+j.ID {
		return errs.Field("journal", "bad merge id %q or staging %q", j.ID, j.Staging)
	}
	return nil
}

func (a *Agent) handleMergeStage(w http.ResponseWriter, r *http.Request) {
	br := bufio.NewReaderSize(r.Body, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull || len(line) > maxMergeJournal {
			writeError(w, errs.Field("journal", "the body must start with one line of journal JSON"))
			return
		}
	}
	var j merge.Journal
	if err := json.Unmarshal(line, &j); err != nil {
		writeError(w, errs.Field("journal", "journal JSON: %v", err))
		return
	}
	if err := checkJournal(&j); err != nil {
		writeError(w, err)
		return
	}
	t0 := time.Now()
	// sync=host: the daemon syncs the host upper after this (runsc with
	// --overlay2=none writes through to it); skipping it only risks the
	// tenant's own merge on a power loss.
	o := merge.StageOptions{NoSync: r.URL.Query().Get("sync") == "host"}
	if err := merge.StageFromTar(r.Context(), mergeRoot, &j, br, o); err != nil {
		writeError(w, err)
		return
	}
	a.log.Info("merge staged", "merge", j.ID, "steps", len(j.Steps), "ms", time.Since(t0).Milliseconds())
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleMergeStop(w http.ResponseWriter, r *http.Request) {
	var req agentapi.MergeStopRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	want := map[string]bool{}
	for _, p := range req.Paths {
		want["/"+strings.TrimPrefix(p, "/")] = true
	}
	self := os.Getpid()
	var res agentapi.MergeStopResult
	stops.mu.Lock()
	defer stops.mu.Unlock()
	for i, pid := range procPids() {
		if i >= maxScanProcs {
			break
		}
		if pid == self {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			continue
		}
		stops.pids[pid] = true
		res.Stopped++
		if len(want) > 0 && len(res.OpenFiles) < maxOpenReported {
			res.OpenFiles = append(res.OpenFiles, openIn(pid, want, maxOpenReported-len(res.OpenFiles))...)
		}
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *Agent) handleMergeCommit(w http.ResponseWriter, r *http.Request) {
	var req agentapi.MergeJournal
	if err := decodeBig(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := checkJournal(&req.Journal); err != nil {
		writeError(w, err)
		return
	}
	var res agentapi.MergeCommitResult
	rolledBack, err := merge.Commit(mergeRoot, &req.Journal, nil)
	if err != nil {
		res.RolledBack, res.Error = rolledBack, err.Error()
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *Agent) handleMergeFinish(w http.ResponseWriter, r *http.Request) {
	var req agentapi.MergeJournal
	if err := decodeBig(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := checkJournal(&req.Journal); err != nil {
		writeError(w, err)
		return
	}
	err := merge.Recover(mergeRoot, &req.Journal)
	stops.mu.Lock()
	for pid := range stops.pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		delete(stops.pids, pid)
	}
	stops.mu.Unlock()
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeBig decodes a journal body, which may exceed the 1 MiB of other
// control requests.
func decodeBig(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxMergeJournal))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errs.Field("journal", "journal JSON: %v", err)
	}
	return nil
}

// procPids are the pids in /proc, sorted.
func procPids() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []int
	for _, n := range names {
		if p, err := strconv.Atoi(n); err == nil && p > 0 {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// openIn lists pid's fds that point at one of want (readlink only).
func openIn(pid int, want map[string]bool, max int) []agentapi.MergeOpenFile {
	base := "/proc/" + strconv.Itoa(pid)
	d, err := os.Open(base + "/fd")
	if err != nil {
		return nil
	}
	fds, _ := d.Readdirnames(maxScanFDs)
	d.Close()
	var out []agentapi.MergeOpenFile
	for _, fd := range fds {
		l, err := os.Readlink(base + "/fd/" + fd)
		if err != nil || !want[l] {
			continue
		}
		comm, _ := os.ReadFile(base + "/comm")
		if len(comm) > 64 {
			comm = comm[:64]
		}
		out = append(out, agentapi.MergeOpenFile{PID: pid, Cmd: strings.TrimSpace(string(comm)), Path: strings.TrimPrefix(l, "/")})
		if len(out) >= max {
			break
		}
	}
	return out
}
