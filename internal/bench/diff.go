package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// The diff row (issue 18): the figure the design promises is "diff of a
// fork that changed 100 files of a 1 GiB workspace ≤ 100 ms".
const (
	defDiff = "A sandbox builds a 1 GiB workspace in /home/user/ws (ten 100 MiB files of random bytes, 1000 small files, 100 text files of 200 lines: fsdifftest's shape) and is forked once; the child edits one line of each of the 100 text files. The clock starts when GET /v1/sandboxes/{child}/diff (no `against`: since the fork point; unified text diffs included) is sent and stops when the whole JSON answer has been read; each answer is checked outside the clock (100 modified files, +100 -100 lines). Goal ≤ 100 ms."
	diffWS  = "/home/user/ws"
)

// diffWorkspace is the shell script that builds the workspace.
const diffWorkspace = `set -e; mkdir -p ` + diffWS + `/big ` + diffWS + `/small ` + diffWS + `/src; cd ` + diffWS + `
for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/urandom of=big/blob$i bs=1048576 count=100 2>/dev/null; done
i=0; while [ $i -lt 1000 ]; do echo "small $i" > small/f$i; i=$((i+1)); done
n=0; while [ $n -lt 100 ]; do l=0; while [ $l -lt 200 ]; do echo "line $l of file $n, as the template has it"; l=$((l+1)); done > src/t$n.txt; n=$((n+1)); done
sync`

// diffEdit edits line 100 of every text file.
const diffEdit = `cd ` + diffWS + `/src && for f in t*.txt; do sed -i 's/^line 100 of file \([0-9]*\), as the template has it$/line 100 of file \1, edited by the fork/' $f; done; sync`

func (r *Runner) diff(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "diff", Runtime: rt, Unit: "ms", Definition: defDiff, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if _, err := r.c.Sandbox("bench0missing").Diff(ctx, client.DiffOptions{}); noRoute(err) {
		return fail("diff has not landed: the server does not serve GET /v1/sandboxes/{id}/diff")
	}
	parent, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.DiskMiB = 2048 })
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, parent.ID)
	res, err := r.c.Exec(ctx, parent.ID, "sh", "-c", diffWorkspace)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d", res.ExitCode)
	}
	if err != nil {
		return fail("building the 1 GiB workspace: " + err.Error())
	}
	fr, err := r.c.Fork(ctx, parent.ID, 1)
	if err != nil || len(fr.Sandboxes) != 1 {
		return fail(fmt.Sprintf("fork: %v %s", err, fr.Reason))
	}
	child := fr.Sandboxes[0].ID
	defer func() {
		r.remove(ctx, child)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := r.c.DeleteSnapshot(dctx, fr.Snapshot); derr != nil {
			r.logf("delete fork snapshot %s: %v", fr.Snapshot, derr)
		}
	}()
	res, err = r.c.Exec(ctx, child, "sh", "-c", diffEdit)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d", res.ExitCode)
	}
	if err != nil {
		return fail("editing 100 files in the fork: " + err.Error())
	}
	sb := r.c.Sandbox(child)
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		d, err := sb.Diff(ctx, client.DiffOptions{})
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		return took, checkDiff(d)
	})
	m.Notes = "fork_mode " + fr.Mode
	return []Metric{m}
}

// checkDiff is the answer the row expects: the 100 edits under ws/src
// (the fork's own files, e.g. /etc/hostname, may add a few more paths).
func checkDiff(d wire.DiffResult) error {
	mod, plus, minus := 0, 0, 0
	for _, c := range d.Changes {
		if strings.HasPrefix(c.Path, strings.TrimPrefix(diffWS, "/")+"/src/") && c.Kind == "modified" && strings.Contains(c.Unified, "edited by the fork") {
			mod++
			plus += c.LinesAdded
			minus += c.LinesRemoved
		}
	}
	if mod != 100 || plus != 100 || minus != 100 {
		return fmt.Errorf("diff answer: %d of 100 edited files (+%d -%d), %d changes in all", mod, plus, minus, len(d.Changes))
	}
	return nil
}
