package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// The handoff notes' row (internal/notes): writing a note on demand of a
// running sandbox with a git repository it edits, the same collection a
// pause and a stop wait for (bounded at 2 s).

const (
	defNoteWrite   = "A sandbox whose workspace holds a git repository (git init, one commit, then one new file per sample and an edit, written outside the clock); the clock starts when POST /v1/sandboxes/{id}/note {} is sent and stops when it answers 201: the agent's process list, the view of the sandbox's own layers (runc: the host upper through safefs; runsc: `runsc tar rootfs-upper`), the manifest walk and hashes of small files, the change list against the previous note, one bounded git exec through the agent for the repositories found, the note stored. The same work a pause or a stop waits for (at most 2 s). Baseline: an `echo ok` exec round trip on the same sandbox in the same run."
	defNoteExecRTT = "POST /v1/sandboxes/{id}/exec of `echo ok` until its exit event, on the same sandbox."
)

// noteWrite measures an on-demand note.
func (r *Runner) noteWrite(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "note-write", Runtime: rt, Unit: "ms", Definition: defNoteWrite, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	sb, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, sb.ID)
	n := r.c.Sandbox(sb.ID).Notes()
	if _, err := n.Current(ctx); noRoute(err) {
		return fail("handoff notes have not landed: the server does not serve GET /v1/sandboxes/{id}/note")
	}
	res, err := r.c.Exec(ctx, sb.ID, "sh", "-c", "command -v git >/dev/null && mkdir -p ~/bench-repo && cd ~/bench-repo && git init -q && "+
		"git config user.email b@example.com && git config user.name bench && echo one > a.txt && git add a.txt && git commit -qm one")
	if err != nil || res.ExitCode != 0 {
		return fail(fmt.Sprintf("the template has no git, or the repository could not be made (exit %d, %v)", res.ExitCode, err))
	}
	var files, repos []float64
	i := 0
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		i++
		if res, err := r.c.Exec(ctx, sb.ID, "sh", "-c", "cd ~/bench-repo && echo "+strconv.Itoa(i)+" >> a.txt && echo x > f"+strconv.Itoa(i)); err != nil || res.ExitCode != 0 {
			return 0, fmt.Errorf("editing the repository: exit %d, %v", res.ExitCode, err)
		}
		start := time.Now()
		note, err := n.Write(ctx, wire.NoteRequest{})
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		if !note.Collected || note.Files.Total == 0 || len(note.Repos) == 0 {
			return 0, fmt.Errorf("note #%d: collected %v, %d files, %d repositories (%s %s)", note.Seq, note.Collected, note.Files.Total, len(note.Repos), note.Files.Error, note.GitError)
		}
		files, repos = append(files, float64(note.Files.Total)), append(repos, float64(len(note.Repos)))
		return d, nil
	})
	if len(files) > 0 {
		m.Derived = map[string]float64{"files_changed": files[len(files)-1], "repos": repos[len(repos)-1]}
	}
	s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		res, err := r.c.Exec(ctx, sb.ID, "echo", "ok")
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("echo exited %d", res.ExitCode)
		}
		return time.Since(start), err
	})
	m.Baseline = baseline("exec echo ok", defNoteExecRTT, s, e)
	return []Metric{m}
}
