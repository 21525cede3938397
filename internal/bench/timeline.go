package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// The timeline's rows (internal/timeline): a files-only checkpoint of a
// sandbox that changed 100 MiB since its previous checkpoint, and a rewind
// to a files-only checkpoint until the first exec answers, against a cold
// create measured in the same run.

const (
	defCheckpointFiles = "A sandbox (disk 1 GiB) rewrites a 100 MiB file of random bytes in its workspace (dd, outside the clock) after its previous checkpoint; the clock starts when POST /v1/sandboxes/{id}/checkpoints {} (files only) is sent and stops when it answers 201: the sandbox frozen (runc: its freezer cgroup written directly; runsc: its Sentry asked over the control socket, as runsc pause does), the diff against the previous checkpoint (a quick check by stat: no content read), the 100 MiB delta layer written (blocks fallocated, then copy_file_range on one filesystem, else sendfile), named by a digest of (checkpoint id, entry list) and stored, the sandbox thawed (runc: the cgroup; runsc: the control socket); the server's event breaks it down (freeze_ms, diff_ms, write_ms, import_ms, thaw_ms, store_ms). Goal ≤ 50 ms."
	defHostCopy100     = "Taken in every sample right after the checkpoint, so both meet the same page-cache and writeback state: 100 MiB of random bytes written to a host file without fsync (as dd leaves the sandbox's file: dirty pages, outside the clock), then copied into a new file in the same host directory (io.Copy between *os.File: copy_file_range), no fsync."
	defRewindFiles     = "A sandbox with a 1 MiB file checkpointed files-only, then changed; the clock starts when POST /v1/sandboxes/{id}/rewind {to} is sent and stops when a following `echo ok` exec has returned its output (runc: PID 1 found in the container's cgroup, killed and waited for on a pidfd, no runc exec, then the container deleted; the network attachment kept; the sandbox booted on the checkpoint's layers over a fresh workspace). Baseline: create-cold (POST /v1/sandboxes → `echo ok`) measured in the same run; goal ratio ≤ 1.3."
	timelineMiB        = 100
	timelineFile       = "/home/user/timeline.bin"
)

// checkpointFiles measures a files-only checkpoint of 100 MiB of changes.
func (r *Runner) checkpointFiles(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "checkpoint-files", Runtime: rt, Unit: "ms", Definition: defCheckpointFiles, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	sb, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.DiskMiB = 1024 })
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, sb.ID)
	tl := r.c.Sandbox(sb.ID).Timeline()
	if _, err := tl.List(ctx); noRoute(err) {
		return fail("checkpoints have not landed: the server does not serve GET /v1/sandboxes/{id}/checkpoints")
	}
	if _, err := tl.Checkpoint(ctx, wire.CheckpointRequest{}); err != nil { // the first one holds the agent's own files
		return fail("first checkpoint: " + err.Error())
	}
	hc, err := newHostCopier()
	if err != nil {
		return fail("host copy baseline: " + err.Error())
	}
	defer hc.close()
	var bytes, base []float64
	var baseErr []string
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		res, err := r.c.Exec(ctx, sb.ID, "dd", "if=/dev/urandom", "of="+timelineFile, "bs=1048576", "count="+strconv.Itoa(timelineMiB))
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("dd exited %d", res.ExitCode)
		}
		if err != nil {
			return 0, fmt.Errorf("writing 100 MiB: %w", err)
		}
		start := time.Now()
		ck, err := tl.Checkpoint(ctx, wire.CheckpointRequest{})
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		if ck.Bytes < timelineMiB<<20 || ck.Mode != "files" {
			return 0, fmt.Errorf("checkpoint #%d holds %d bytes in mode %s, want ≥ %d in files", ck.Seq, ck.Bytes, ck.Mode, timelineMiB<<20)
		}
		bytes = append(bytes, float64(ck.Bytes))
		if err := tl.Delete(ctx, ck.ID); err != nil { // keep the quota and the disk free
			r.logf("delete checkpoint %s: %v", ck.ID, err)
		}
		// The baseline in the same moment: a quiet series and one the host's
		// writeback slows down differ by 10×, for berth and the host alike.
		if b, err := hc.sample(); err != nil {
			baseErr = append(baseErr, err.Error())
		} else {
			base = append(base, ms(b))
		}
		return d, nil
	})
	if len(bytes) > 0 {
		m.Derived = map[string]float64{"delta_mib": bytes[len(bytes)-1] / (1 << 20)}
	}
	if w := r.o.Warmups; w > 0 && len(base) > w {
		base = base[w:]
	}
	m.Baseline = baseline("host copy_file_range 100 MiB", defHostCopy100, base, baseErr)
	return []Metric{m}
}

// hostCopier times copy_file_range of 100 MiB just written to the host.
type hostCopier struct{ dir string }

func newHostCopier() (*hostCopier, error) {
	dir, err := os.MkdirTemp("", "berth-bench-timeline-")
	if err != nil {
		return nil, err
	}
	return &hostCopier{dir: dir}, nil
}

func (h *hostCopier) close() { os.RemoveAll(h.dir) }

// sample writes the source (dirty, outside the clock) and times the copy.
func (h *hostCopier) sample() (time.Duration, error) {
	src, dst := filepath.Join(h.dir, "src"), filepath.Join(h.dir, "dst")
	defer os.Remove(src)
	defer os.Remove(dst)
	w, err := os.Create(src)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(w, io.LimitReader(rand.Reader, timelineMiB<<20))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	start := time.Now()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return time.Since(start), err
}

// rewindFiles measures rewind → first exec against a cold create.
func (r *Runner) rewindFiles(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "rewind-files", Runtime: rt, Unit: "ms", Definition: defRewindFiles, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	sb, err := r.create(ctx, rt)
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, sb.ID)
	tl := r.c.Sandbox(sb.ID).Timeline()
	if _, err := tl.List(ctx); noRoute(err) {
		return fail("rewind has not landed: the server does not serve GET /v1/sandboxes/{id}/checkpoints")
	}
	if res, err := r.c.Exec(ctx, sb.ID, "sh", "-c", "head -c 1048576 /dev/urandom > /home/user/kept"); err != nil || res.ExitCode != 0 {
		return fail(fmt.Sprintf("write: %v (exit %d)", err, res.ExitCode))
	}
	ck, err := tl.Checkpoint(ctx, wire.CheckpointRequest{})
	if err != nil {
		return fail("checkpoint: " + err.Error())
	}
	defer func() {
		if err := tl.Delete(context.WithoutCancel(ctx), ck.ID); err != nil {
			r.logf("delete checkpoint %s: %v", ck.ID, err)
		}
	}()
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		if res, err := r.c.Exec(ctx, sb.ID, "sh", "-c", "rm /home/user/kept; echo later > /home/user/later"); err != nil || res.ExitCode != 0 {
			return 0, fmt.Errorf("change before the rewind: %v (exit %d)", err, res.ExitCode)
		}
		start := time.Now()
		if _, err := tl.Rewind(ctx, ck.ID); err != nil {
			return 0, err
		}
		if err := r.c.EchoOK(ctx, sb.ID); err != nil {
			return 0, err
		}
		d := time.Since(start)
		res, err := r.c.Exec(ctx, sb.ID, "sh", "-c", "wc -c < /home/user/kept; ls /home/user/later 2>/dev/null | wc -l")
		if err != nil || res.Stdout != "1048576\n0\n" {
			return 0, fmt.Errorf("after the rewind: %q (%v), want the checkpoint's files", res.Stdout, err)
		}
		return d, nil
	})
	s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		c, err := r.create(ctx, rt)
		if err != nil {
			return 0, err
		}
		defer r.remove(ctx, c.ID)
		if err := r.c.EchoOK(ctx, c.ID); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	m.Baseline = baseline("create-cold (same run)", defCreateCold, s, e)
	return []Metric{m}
}
