package bench

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/api/wire"
)

const (
	defDensity   = "N idle sandboxes (agent only) created one after another; 2 s after the last, each sandbox's host memory is read from its cgroup (v1 memory.usage_in_bytes of /berth/ID, v2 memory.current): every process of the sandbox plus the kernel memory and page cache charged to it; for runsc the Sentry and gofer. One sample per sandbox, in MiB; per_gib = 1024 / p50."
	defUpload64  = "Clock starts when PUT /v1/sandboxes/{id}/files of 64 MiB of random bytes (to the sandbox's workspace disk) is sent and stops when it answers; the agent fsyncs the file and its directory before answering."
	defUploadSm  = "As upload-64MiB for 1000 files of 4 KiB, sent one after another; one sample is all 1000."
	defDown64    = "Clock starts when GET /v1/sandboxes/{id}/files of the 64 MiB file is sent and stops when every byte has been written to a host file and fsynced."
	defDownSm    = "As download-64MiB for the 1000 files of 4 KiB, one after another, each written and fsynced on the host; one sample is all 1000."
	defHostWrite = "The same bytes written to new files in a host temp directory, each file and the directory fsynced."
	defUploadBat = "The same 1000 files of 4 KiB as upload-1000x4KiB in one POST /v1/sandboxes/{id}/files:batch (a tar built in memory outside the clock, into a fresh directory per sample); the clock starts when the request is sent and stops when it answers: every file written by the agent inside the sandbox (temporary name, chown, rename) and one syncfs(2) of the workspace for the whole batch (taken by the server on the host, on the workspace image). Baseline: host write+fsync of the same 1000 files (each file and the directory fsynced), the issue's reference; derived host_syncfs_ms: the same 1000 files written on the host followed by one syncfs, the same durability promise as the batch; agent_write_ms and agent_sync_ms: p50 of the split of each batch the answer gives (write_ms: the agent receiving and writing; sync_ms: the barrier)."
	defDownBat   = "GET /v1/sandboxes/{id}/files:batch of the directory of 1000 files of 4 KiB: the clock starts when the request is sent and stops when the whole tar has been read and every file written to a host directory and fsynced (and the directory). Baseline: host write+fsync of the same files."
	defFork      = "A sandbox with 100 MiB written to its workspace is forked 10 times; the clock starts when POST /v1/sandboxes/{id}/fork is sent and stops when every child has returned `echo ok` output."
	defCpWS      = "cp -a of a host directory holding the same 100 MiB, 10 times."
	defPauseMem  = "A sandbox (memory limit 2 GiB) whose dd holds 1 GiB of random bytes resident; clock starts when POST /v1/sandboxes/{id}/pause {mode: memory} is sent and stops when it answers with pause_mode memory (checkpoint durable on disk, RAM freed)."
	defResumeMem = "Clock starts when POST /v1/sandboxes/{id}/resume of the memory-paused sandbox is sent and stops when a following `echo ok` exec has returned its output; the workload is checked alive afterwards."
	defRawCkpt   = "The same workload in a raw container; `runsc checkpoint --direct` (runc: CRIU checkpoint, image directory synced), clock around the one command."
	defRawRest   = "`runsc restore --direct --detach` (runc: `restore --detach`) of that image, clock around the one command (no exec after it)."
	defE2BWarm   = "As e2b-tti, with a warm pool of 3 on the template (server default runtime and resources, as the SDK's create), refilled to 3 outside the clock before every create: each create is a pool hit, checked after the clock (extra.claimed_from_pool; a miss is a failed sample)."
	defWarmExec  = "`echo ok` exec'd once more in the sandbox just claimed, right after the sample: the exec share of create-warm."
	defE2B       = "The unmodified npm e2b SDK (test/e2b) in node: clock starts before Sandbox.create(template) and stops when sandbox.commands.run('echo ok') resolved with stdout \"ok\\n\"; kill is outside the clock."
)

// createWarm sets a warm pool of the bench template on rt, waits until it
// is full, and times create → `echo ok` with the same request create-cold
// sends (a pool hit). A create the server did not serve from the pool
// (no extra.claimed_from_pool) is a failed sample.
func (r *Runner) createWarm(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "create-warm", Runtime: rt, Unit: "ms", Definition: defCreateWarm, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if _, err := r.c.Pools(ctx); noRoute(err) {
		return fail("warm pools have not landed: the server does not serve /v1/pools")
	} else if err != nil {
		return fail(err.Error())
	}
	wp, err := r.setWarmPool(ctx, r.o.Template, rt)
	if wp != nil {
		defer wp.restore(ctx)
	}
	if err != nil {
		return fail("warm pool: " + err.Error())
	}
	base := []float64{}
	var baseErr []string
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		if i > 0 {
			if _, err := wp.waitFull(ctx, poolRefillLimit); err != nil {
				m.Errors = append(m.Errors, err.Error())
				break
			}
		}
		d, bd, err, berr := r.warmSample(ctx, rt)
		switch {
		case err != nil:
			m.Errors = append(m.Errors, err.Error())
		case i >= r.o.Warmups:
			m.Samples = append(m.Samples, ms(d))
			if berr != nil {
				baseErr = append(baseErr, berr.Error())
			} else {
				base = append(base, ms(bd))
			}
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	m.Derived = wp.counters(ctx)
	m.Baseline = baseline("exec echo ok, same sandbox", defWarmExec, base, baseErr)
	return []Metric{m}
}

// warmSample is one create-warm sample (d) and its baseline (bd): `echo ok`
// once more in the sandbox just claimed.
func (r *Runner) warmSample(ctx context.Context, rt string) (d, bd time.Duration, err, berr error) {
	start := time.Now()
	sb, err := r.create(ctx, rt)
	if err != nil {
		return 0, 0, err, nil
	}
	defer r.remove(ctx, sb.ID)
	if err := r.c.EchoOK(ctx, sb.ID); err != nil {
		return 0, 0, err, nil
	}
	d = time.Since(start)
	if sb.Extra["claimed_from_pool"] == "" {
		return 0, 0, fmt.Errorf("pool miss: %s was not claimed from the pool (no extra.claimed_from_pool)", sb.ID), nil
	}
	start = time.Now()
	berr = r.c.EchoOK(ctx, sb.ID)
	return d, time.Since(start), nil, berr
}

// ForkChildren is how many children one fork sample makes.
const ForkChildren = 10

// fork times POST /v1/sandboxes/{id}/fork {"count": 10} of a sandbox with
// 100 MiB in its workspace until every child answered `echo ok`.
func (r *Runner) fork(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "fork", Runtime: rt, Unit: "ms", Definition: defFork, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if _, err := r.c.Fork(ctx, "bench0missing", 1); noRoute(err) {
		return fail("fork has not landed: the server does not serve POST /v1/sandboxes/{id}/fork")
	}
	host, err := os.MkdirTemp("", "berth-bench-fork-")
	if err != nil {
		return fail(err.Error())
	}
	defer os.RemoveAll(host)
	src := filepath.Join(host, "src")
	if err := os.MkdirAll(src, 0o755); err == nil {
		err = writeSynced(filepath.Join(src, "fork.bin"), io.LimitReader(rand.Reader, forkMiB<<20))
	}
	if err != nil {
		return fail("host copy of the workspace: " + err.Error())
	}
	parent, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.DiskMiB = 1024 })
	if err != nil {
		return fail("create failed: " + err.Error())
	}
	defer r.remove(ctx, parent.ID)
	res, err := r.c.Exec(ctx, parent.ID, "dd", "if=/dev/urandom", "of="+forkFile, "bs=1048576", "count="+strconv.Itoa(forkMiB))
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("dd exited %d", res.ExitCode)
	}
	if err != nil {
		return fail("writing 100 MiB to the workspace: " + err.Error())
	}
	modes := map[string]int{}
	reasons := map[string]bool{}
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		d, fr, err := r.forkSample(ctx, parent.ID)
		if fr.Reason != "" {
			reasons[fr.Reason] = true
		}
		switch {
		case err != nil:
			m.Errors = append(m.Errors, err.Error())
		case i >= r.o.Warmups:
			m.Samples = append(m.Samples, ms(d))
			for _, c := range fr.Sandboxes {
				modes[cmp.Or(c.Extra["fork_mode"], fr.Mode)]++
			}
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	if len(modes) > 0 {
		m.Derived = map[string]float64{}
		var notes []string
		for _, k := range slices.Sorted(maps.Keys(modes)) {
			m.Derived["children_"+k] = float64(modes[k])
			notes = append(notes, fmt.Sprintf("%d children fork_mode %s", modes[k], k))
		}
		m.Notes = strings.Join(notes, ", ")
		if len(reasons) > 0 {
			m.Notes += "; " + strings.Join(slices.Sorted(maps.Keys(reasons)), "; ")
		}
	}
	s, e := r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		for j := range ForkChildren {
			if out, err := exec.CommandContext(ctx, "cp", "-a", src, filepath.Join(host, "copy"+strconv.Itoa(j))).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("cp -a: %v: %s", err, out)
			}
		}
		d := time.Since(start)
		for j := range ForkChildren {
			_ = os.RemoveAll(filepath.Join(host, "copy"+strconv.Itoa(j)))
		}
		return d, nil
	})
	m.Baseline = baseline("cp -a ×10", defCpWS, s, e)
	return []Metric{m}
}

const (
	forkMiB  = 100
	forkFile = "/home/user/fork.bin"
)

// forkSample forks parent ForkChildren times and waits for every child's
// `echo ok`. Outside the clock it checks that a child has the parent's
// 100 MiB, then removes the children and the fork's snapshot.
func (r *Runner) forkSample(ctx context.Context, parent string) (time.Duration, wire.ForkResult, error) {
	start := time.Now()
	fr, err := r.c.Fork(ctx, parent, ForkChildren)
	if err != nil {
		return 0, fr, err
	}
	errList := make([]error, len(fr.Sandboxes))
	var wg sync.WaitGroup
	for i, c := range fr.Sandboxes {
		wg.Go(func() { errList[i] = r.c.EchoOK(ctx, c.ID) })
	}
	wg.Wait()
	d := time.Since(start)
	ids := make([]string, 0, len(fr.Sandboxes))
	for _, c := range fr.Sandboxes {
		ids = append(ids, c.ID)
	}
	err = errors.Join(errList...)
	if err == nil && len(fr.Sandboxes) != ForkChildren {
		err = fmt.Errorf("fork made %d of %d children: %s", len(fr.Sandboxes), ForkChildren, fr.Reason)
	}
	if err == nil {
		res, cerr := r.c.Exec(ctx, ids[0], "sh", "-c", "wc -c < "+forkFile)
		if want := strconv.Itoa(forkMiB << 20); cerr != nil || strings.TrimSpace(res.Stdout) != want {
			err = fmt.Errorf("child %s has %q bytes of %s, want %s (%v)", ids[0], strings.TrimSpace(res.Stdout), forkFile, want, cerr)
		}
	}
	r.removeAll(ctx, ids)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if derr := r.c.DeleteSnapshot(dctx, fr.Snapshot); derr != nil {
		r.logf("delete fork snapshot %s: %v", fr.Snapshot, derr)
	}
	return d, fr, err
}

// cgroupMemory reads a sandbox's host memory from its cgroup; it works only
// when the server runs on this host.
func cgroupMemory(id string) (uint64, error) {
	for _, p := range []string{"/sys/fs/cgroup/memory/berth/" + id + "/memory.usage_in_bytes", "/sys/fs/cgroup/berth/" + id + "/memory.current"} {
		b, err := os.ReadFile(p)
		if err == nil {
			return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, fmt.Errorf("no cgroup for sandbox %s on this host (is the server local?)", id)
}

func (r *Runner) density(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "density", Runtime: rt, Unit: "MiB", Definition: defDensity, Available: true, Samples: []float64{}}
	var ids []string
	defer func() { r.removeAll(ctx, ids) }()
	for range r.o.Runs {
		sb, err := r.create(ctx, rt)
		if err != nil {
			m.Errors = append(m.Errors, err.Error())
			continue
		}
		ids = append(ids, sb.ID)
	}
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	for _, id := range ids {
		b, err := cgroupMemory(id)
		if err != nil {
			return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, err.Error())}
		}
		m.Samples = append(m.Samples, float64(b)/(1<<20))
	}
	if s := Summarize(m.Samples); s != nil && s.P50 > 0 {
		m.Derived = map[string]float64{"per_gib": 1024 / s.P50}
	}
	return []Metric{m}
}

// writeSynced writes data to path and fsyncs it.
func writeSynced(path string, data io.Reader) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (r *Runner) fileIO(ctx context.Context, rt string) []Metric {
	u64 := Metric{Name: "upload-64MiB", Runtime: rt, Unit: "ms", Definition: defUpload64, Available: true}
	u4 := Metric{Name: "upload-1000x4KiB", Runtime: rt, Unit: "ms", Definition: defUploadSm, Available: true}
	d64 := Metric{Name: "download-64MiB", Runtime: rt, Unit: "ms", Definition: defDown64, Available: true}
	d4 := Metric{Name: "download-1000x4KiB", Runtime: rt, Unit: "ms", Definition: defDownSm, Available: true}
	ub := Metric{Name: "upload-1000x4KiB-batch", Runtime: rt, Unit: "ms", Definition: defUploadBat, Available: true}
	db := Metric{Name: "download-1000x4KiB-batch", Runtime: rt, Unit: "ms", Definition: defDownBat, Available: true}
	all := []*Metric{&u64, &u4, &d64, &d4, &ub, &db}
	// measure skips a row --only left out (its row reports no samples).
	measure := func(m *Metric, fn func(ctx context.Context) (time.Duration, error)) ([]float64, []string) {
		if !r.want(m.Name) {
			return []float64{}, nil
		}
		return r.measure(ctx, fn)
	}
	fail := func(err error) []Metric {
		out := []Metric{}
		for _, m := range all {
			out = append(out, notAvailable(m.Name, m.Runtime, m.Unit, m.Definition, err.Error()))
		}
		return out
	}
	big := make([]byte, 64<<20)
	_, _ = rand.Read(big)
	small := big[:4<<10]
	host, err := os.MkdirTemp("", "berth-bench-io-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(host)
	sb, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.DiskMiB = 1024 })
	if err != nil {
		return fail(fmt.Errorf("create failed: %w", err))
	}
	defer r.remove(ctx, sb.ID)
	if _, err := r.c.Exec(ctx, sb.ID, "mkdir", "-p", "/home/user/small"); err != nil {
		return fail(err)
	}
	n := 0
	hostDir := func() string {
		n++
		d := filepath.Join(host, strconv.Itoa(n))
		_ = os.MkdirAll(d, 0o755)
		return d
	}
	syncDirFile := func(d string) error {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	}
	timed := func(fn func() error) (time.Duration, error) {
		start := time.Now()
		err := fn()
		return time.Since(start), err
	}
	u64.Samples, u64.Errors = measure(&u64, func(ctx context.Context) (time.Duration, error) {
		return timed(func() error { return r.c.WriteFile(ctx, sb.ID, "/home/user/big.bin", bytes.NewReader(big)) })
	})
	u4.Samples, u4.Errors = measure(&u4, func(ctx context.Context) (time.Duration, error) {
		return timed(func() error {
			for i := range 1000 {
				if err := r.c.WriteFile(ctx, sb.ID, fmt.Sprintf("/home/user/small/f%04d", i), bytes.NewReader(small)); err != nil {
					return err
				}
			}
			return nil
		})
	})
	d64.Samples, d64.Errors = measure(&d64, func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error {
			f, err := os.Create(filepath.Join(dir, "big.bin"))
			if err != nil {
				return err
			}
			defer f.Close()
			if n, err := r.c.ReadFile(ctx, sb.ID, "/home/user/big.bin", f); err != nil || n != int64(len(big)) {
				return fmt.Errorf("downloaded %d bytes: %v", n, err)
			}
			return f.Sync()
		})
	})
	var smallTar bytes.Buffer
	{
		tw := tar.NewWriter(&smallTar)
		for i := range 1000 {
			_ = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%04d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(small))})
			_, _ = tw.Write(small)
		}
		_ = tw.Close()
	}
	if !r.want(u4.Name) && (r.want(d4.Name) || r.want(db.Name)) {
		// The download rows read the files upload-1000x4KiB writes: when
		// that row is not measured, one batch writes them, outside any clock.
		if _, err := r.c.Sandbox(sb.ID).WriteFiles(ctx, "/home/user/small", "", bytes.NewReader(smallTar.Bytes())); err != nil {
			return fail(err)
		}
	}
	d4.Samples, d4.Errors = measure(&d4, func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error {
			for i := range 1000 {
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%04d", i)))
				if err != nil {
					return err
				}
				_, err = r.c.ReadFile(ctx, sb.ID, fmt.Sprintf("/home/user/small/f%04d", i), f)
				if err == nil {
					err = f.Sync()
				}
				f.Close()
				if err != nil {
					return err
				}
			}
			return nil
		})
	})
	batchN := 0
	var agentWrite, agentSync []float64
	ub.Samples, ub.Errors = measure(&ub, func(ctx context.Context) (time.Duration, error) {
		batchN++
		dir := fmt.Sprintf("/home/user/batch%d", batchN)
		return timed(func() error {
			res, err := r.c.Sandbox(sb.ID).WriteFiles(ctx, dir, "", bytes.NewReader(smallTar.Bytes()))
			if err == nil && res.Files != 1000 {
				err = fmt.Errorf("batch wrote %d files, want 1000", res.Files)
			}
			agentWrite, agentSync = append(agentWrite, res.WriteMS), append(agentSync, res.SyncMS)
			return err
		})
	})
	db.Samples, db.Errors = measure(&db, func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error { return untarSynced(ctx, r.c, sb.ID, "/home/user/small", dir) })
	})
	hostBig := func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error {
			if err := writeSynced(filepath.Join(dir, "big.bin"), bytes.NewReader(big)); err != nil {
				return err
			}
			return syncDirFile(dir)
		})
	}
	hostSmall := func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error {
			for i := range 1000 {
				if err := writeSynced(filepath.Join(dir, fmt.Sprintf("f%04d", i)), bytes.NewReader(small)); err != nil {
					return err
				}
				if err := syncDirFile(dir); err != nil {
					return err
				}
			}
			return nil
		})
	}
	s, e := r.measure(ctx, hostBig)
	u64.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	d64.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	s, e = r.measure(ctx, hostSmall)
	u4.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	d4.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	ub.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	db.Baseline = baseline("host write+fsync", defHostWrite, s, e)
	hs, _ := r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		dir := hostDir()
		return timed(func() error { return writeSyncfs(dir, small) })
	})
	for _, m := range all {
		mib := 64.0
		if strings.Contains(m.Name, "x4KiB") {
			mib = 1000 * 4.0 / 1024
		}
		if s := Summarize(m.Samples); s != nil && s.P50 > 0 {
			m.Derived = map[string]float64{"mib_per_s": mib / (s.P50 / 1000)}
		}
	}
	if s := Summarize(hs); s != nil && ub.Derived != nil {
		ub.Derived["host_syncfs_ms"] = s.P50
	}
	// The agent's own split (the warm-up's included): where a batch's time goes.
	if w, y := Summarize(agentWrite), Summarize(agentSync); w != nil && y != nil && ub.Derived != nil {
		ub.Derived["agent_write_ms"], ub.Derived["agent_sync_ms"] = w.P50, y.P50
	}
	out := []Metric{}
	for _, m := range all {
		if r.want(m.Name) {
			out = append(out, *m)
		}
	}
	return out
}

func (r *Runner) memoryPause(ctx context.Context, rt string) []Metric {
	p := Metric{Name: "pause-memory", Runtime: rt, Unit: "ms", Definition: defPauseMem, Available: true, Samples: []float64{}}
	q := Metric{Name: "resume-memory", Runtime: rt, Unit: "ms", Definition: defResumeMem, Available: true, Samples: []float64{}}
	both := func(reason string) []Metric {
		return []Metric{notAvailable(p.Name, rt, p.Unit, p.Definition, reason), notAvailable(q.Name, rt, q.Unit, q.Definition, reason)}
	}
	if info := r.runtimeInfo(rt); !info.Checkpoint {
		return both("the server cannot checkpoint " + rt + ": " + info.Reason)
	}
	sb, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.MemoryMiB = 2048 })
	if err != nil {
		return both("create failed: " + err.Error())
	}
	defer r.remove(ctx, sb.ID)
	if err := r.c.Start(ctx, sb.ID, MemoryWorkload...); err != nil {
		return both(err.Error())
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		res, err := r.c.Exec(ctx, sb.ID, "cat", "/tmp/ready")
		if err == nil && res.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return both("the 1 GiB workload did not become ready within 3 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	rss := workloadRSS(ctx, r.c, sb.ID)
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		dp, dr, err := r.pauseResume(ctx, sb.ID, wire.PauseMemory)
		if err != nil {
			p.Errors = append(p.Errors, err.Error())
			if len(p.Errors) > 2 {
				break
			}
			continue
		}
		if i >= r.o.Warmups {
			p.Samples, q.Samples = append(p.Samples, ms(dp)), append(q.Samples, ms(dr))
		}
	}
	q.Errors = p.Errors
	if res, err := r.c.Exec(ctx, sb.ID, "pidof", "dd"); err != nil || res.ExitCode != 0 {
		q.Errors = append(q.Errors, "the workload (dd) did not survive the pause/resume cycles")
	}
	p.Derived = map[string]float64{"workload_rss_mib": rss}
	if r.raw == nil {
		p.Baseline = unavailableBaseline(rt+" checkpoint", defRawCkpt, r.rawEr)
		q.Baseline = unavailableBaseline(rt+" restore", defRawRest, r.rawEr)
	} else {
		r.logf("raw %s checkpoint/restore baseline", rt)
		c, rs, e := r.raw.CheckpointCycles(ctx, rt, r.o.Warmups, r.o.Runs)
		p.Baseline = baseline(rt+" checkpoint", defRawCkpt, c, e)
		q.Baseline = baseline(rt+" restore", defRawRest, rs, e)
	}
	return []Metric{p, q}
}

// workloadRSS is dd's VmRSS inside the sandbox, in MiB (0 if unknown).
func workloadRSS(ctx context.Context, c *Client, id string) float64 {
	res, err := c.Exec(ctx, id, "sh", "-c", "grep VmRSS /proc/$(pidof dd)/status")
	if err != nil {
		return 0
	}
	f := strings.Fields(res.Stdout)
	if len(f) < 2 {
		return 0
	}
	kb, _ := strconv.ParseFloat(f[1], 64)
	return kb / 1024
}

// e2bScript creates and kills sandboxes through the SDK and prints the
// measured samples (after WARMUPS) as JSON. With POOL_SIZE it waits
// (outside the clock) until the template's warm pool is full before each
// create, and counts a sandbox not claimed from the pool as a failure.
const e2bScript = `import { createRequire } from 'node:module'
const require = createRequire(process.env.E2B_DIR + '/package.json')
const { Sandbox } = require('e2b')
const [tpl, total, warmups, pool] = [process.env.TPL, Number(process.env.TOTAL), Number(process.env.WARMUPS), Number(process.env.POOL_SIZE || 0)]
const opts = { apiUrl: process.env.BERTH_URL, sandboxUrl: process.env.BERTH_URL, apiKey: process.env.BERTH_API_KEY, requestTimeoutMs: 120000 }
const api = async (path) => {
  const r = await fetch(process.env.BERTH_URL + path, { headers: { 'X-API-Key': process.env.BERTH_API_KEY } })
  if (!r.ok) throw new Error(path + ': HTTP ' + r.status + ' ' + (await r.text()))
  return r.json()
}
const poolFull = async () => {
  const end = Date.now() + 120000
  for (;;) {
    const p = (await api('/v1/pools')).find(x => x.template === tpl)
    if (p && p.ready >= pool && p.starting === 0) return
    if (Date.now() > end) throw new Error('the pool of ' + tpl + ' did not refill within 120 s: ' + JSON.stringify(p))
    await new Promise(r => setTimeout(r, 100))
  }
}
const samples = [], errors = []
for (let i = 0; i < total; i++) {
  let sbx
  try {
    if (pool > 0) await poolFull()
    const t0 = performance.now()
    sbx = await Sandbox.create(tpl, { ...opts, timeoutMs: 300000, metadata: { 'berth-bench': process.env.LABEL } })
    const r = await sbx.commands.run('echo ok')
    const t1 = performance.now()
    if (r.stdout !== 'ok\n') throw new Error('stdout ' + JSON.stringify(r.stdout))
    if (pool > 0 && !(await api('/v1/sandboxes/' + encodeURIComponent(sbx.sandboxId))).extra?.claimed_from_pool) {
      throw new Error('pool miss: ' + sbx.sandboxId + ' was not claimed from the pool')
    }
    if (i >= warmups) samples.push(t1 - t0)
  } catch (e) { errors.push(String(e?.message ?? e)) }
  try { await sbx?.kill() } catch (e) { errors.push('kill: ' + e) }
}
console.log(JSON.stringify({ samples, errors }))
`

// E2BDir finds test/e2b (with node_modules/e2b) near the working directory or the binary.
func E2BDir() string {
	self, _ := os.Executable()
	for _, d := range []string{os.Getenv("BERTH_E2B_DIR"), "test/e2b", filepath.Join(filepath.Dir(self), "..", "test", "e2b")} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "node_modules", "e2b", "package.json")); err == nil {
			abs, _ := filepath.Abs(d)
			return abs
		}
	}
	return ""
}

func (r *Runner) e2bTTI(ctx context.Context) Metric {
	m := Metric{Name: "e2b-tti", Unit: "ms", Definition: defE2B}
	return r.e2bRun(ctx, m, 0)
}

// e2bTTIWarm is e2b-tti with a warm pool on the template: the SDK's
// create (server default runtime and resources) is a pool hit.
func (r *Runner) e2bTTIWarm(ctx context.Context) Metric {
	m := Metric{Name: "e2b-tti-warm", Unit: "ms", Definition: defE2BWarm}
	if r.o.E2BTemplate == "" && TemplateReady(ctx, r.c, "default") {
		r.o.E2BTemplate = "default"
	}
	if r.o.E2BTemplate == "" {
		return r.e2bRun(ctx, m, WarmPoolSize) // says why not
	}
	if _, err := r.c.Pools(ctx); noRoute(err) {
		m.Reason = "warm pools have not landed: the server does not serve /v1/pools"
		return m
	}
	wp, err := r.setWarmPool(ctx, r.o.E2BTemplate, "")
	if wp != nil {
		defer wp.restore(ctx)
	}
	if err != nil {
		m.Reason = "warm pool: " + err.Error()
		return m
	}
	m = r.e2bRun(ctx, m, WarmPoolSize)
	m.Derived = wp.counters(ctx)
	return m
}

// e2bRun runs e2bScript for m, with a warm pool of poolSize (0: none).
func (r *Runner) e2bRun(ctx context.Context, m Metric, poolSize int) Metric {
	dir := r.o.E2BDir
	if dir == "" {
		dir = E2BDir()
	}
	if dir == "" {
		m.Reason = "test/e2b/node_modules is missing (run npm ci in test/e2b, or set BERTH_E2B_DIR)"
		return m
	}
	node, err := exec.LookPath("node")
	if err != nil {
		m.Reason = "node is not installed"
		return m
	}
	if r.o.E2BTemplate == "" {
		m.Reason = "no template with /bin/bash on the server (the E2B SDK runs commands with bash); pass --e2b-template"
		return m
	}
	tmp, err := os.MkdirTemp("", "berth-bench-e2b-")
	if err != nil {
		m.Reason = err.Error()
		return m
	}
	defer os.RemoveAll(tmp)
	script := filepath.Join(tmp, "tti.mjs")
	if err := os.WriteFile(script, []byte(e2bScript), 0o644); err != nil {
		m.Reason = err.Error()
		return m
	}
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "E2B_DIR="+dir, "TPL="+r.o.E2BTemplate, "TOTAL="+strconv.Itoa(r.o.Warmups+r.o.Runs),
		"WARMUPS="+strconv.Itoa(r.o.Warmups), "POOL_SIZE="+strconv.Itoa(poolSize),
		"BERTH_URL="+r.c.Base, "BERTH_API_KEY="+r.c.Key, "LABEL="+r.label)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		m.Reason = fmt.Sprintf("node: %v: %s", err, oneLine(stderr.String(), 300))
		return m
	}
	var res struct {
		Samples []float64 `json:"samples"`
		Errors  []string  `json:"errors"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil {
		m.Reason = fmt.Sprintf("node printed %q", oneLine(string(out), 200))
		return m
	}
	m.Available = true
	m.Errors = res.Errors
	m.Samples = res.Samples
	m.Definition += " Template: " + r.o.E2BTemplate + "."
	return m
}

// writeSyncfs writes 1000 copies of data to new files in dir and makes them
// durable with one syncfs, the batch API's promise, on the host.
func writeSyncfs(dir string, data []byte) error {
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), data, 0o644); err != nil {
			return err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}

// untarSynced downloads the tree beneath path as a tar into dir, each file
// fsynced, then the directory.
func untarSynced(ctx context.Context, c *Client, id, path, dir string) error {
	body, err := c.Sandbox(id).ReadFiles(ctx, path, "")
	if err != nil {
		return err
	}
	defer body.Close()
	tr := tar.NewReader(body)
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg || strings.Contains(h.Name, "/") {
			continue
		}
		if err := writeSynced(filepath.Join(dir, filepath.Base(h.Name)), tr); err != nil {
			return err
		}
		n++
	}
	if n != 1000 {
		return fmt.Errorf("the tar held %d files, want 1000", n)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
