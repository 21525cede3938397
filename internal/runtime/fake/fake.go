// Package fake is an in-process runtime.Runtime for unit tests of the
// services above the runtime (lifecycle, checkpoint, pools): a sandbox is a
// record with a state, a host pid that is only a number, and a small
// "memory" (string keys) that a checkpoint writes to its image directory
// as data and a restore reads back. Nothing runs and nothing needs root;
// the clock is injected. It passes the contract part of the runtime
// conformance suite (runtimetest.RunContract), the part that needs no
// kernel, so what the services learn from it holds for runc and runsc.
//
// PID 1 is the caller's: Options.Boot is called when a container starts
// (Run or Restore) and its stop function when the container stops, so a
// test can run an agent of its own (e.g. internal/agent in-process) where
// a real backend would start the sandbox's PID 1. Faults are injected
// per operation with FailNext; Exit makes a running PID 1 die.
//
// The Runtime has one lock (mu). Boot and stop functions are called with
// it released.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// ImageFile is the file a checkpoint writes in its image directory.
const ImageFile = "fake-image.json"

// Op names an operation for FailNext.
type Op string

const (
	OpRun        Op = "run"
	OpKill       Op = "kill"
	OpDelete     Op = "delete"
	OpFreeze     Op = "freeze"
	OpThaw       Op = "thaw"
	OpCheckpoint Op = "checkpoint"
	OpRestore    Op = "restore"
	OpState      Op = "state"
	OpList       Op = "list"
	OpStats      Op = "stats"
)

// Options configure a fake runtime; the zero value is a backend named
// "fake" on the wall clock that can freeze and checkpoint.
type Options struct {
	Name string           // what Name reports; default "fake"
	Now  func() time.Time // default time.Now
	// NoCheckpoint makes the backend one that cannot take memory
	// checkpoints here, for CheckpointReason (default "checkpoint disabled").
	NoCheckpoint     bool
	CheckpointReason string
	NoFreeze         bool
	// Boot stands in for PID 1: called (without the runtime's lock) after
	// a container is recorded as running; restoredFrom is the spec the
	// memory image was taken from, nil for Run. An error fails the start
	// and removes the container. stop is called once when the container
	// stops (kill, exit, checkpoint, delete). nil: PID 1 does nothing.
	Boot func(ctx context.Context, spec runtime.Spec, restoredFrom *runtime.Spec) (stop func(), err error)
	// Signal receives the signals Kill delivers to a live PID 1 that do not
	// stop it (e.g. SIGUSR1/SIGUSR2, the agent's quiesce and reopen), with
	// the runtime's lock released. nil: they are ignored.
	Signal func(id string, sig syscall.Signal)
}

// Runtime is the fake backend. Safe for concurrent use.
type Runtime struct {
	opts Options

	mu      sync.Mutex
	boxes   map[string]*box
	nextPid int
	faults  map[Op][]error
	calls   map[Op]int
}

type box struct {
	spec    runtime.Spec
	state   string // created, running, paused, stopped
	pid     int
	created time.Time
	started time.Time // of the current run, for CPU accounting
	cpu     time.Duration
	memory  map[string]string
	ooms    uint64
	stop    func()
}

// image is what Checkpoint writes: the spec and the memory at that instant.
type image struct {
	Spec   runtime.Spec      `json:"spec"`
	Memory map[string]string `json:"memory"`
	Taken  time.Time         `json:"taken"`
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns an empty fake runtime.
func New(o Options) *Runtime {
	if o.Name == "" {
		o.Name = "fake"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NoCheckpoint && o.CheckpointReason == "" {
		o.CheckpointReason = "checkpoint disabled in the fake runtime"
	}
	return &Runtime{opts: o, boxes: map[string]*box{}, nextPid: 1000, faults: map[Op][]error{}, calls: map[Op]int{}}
}

// FailNext makes the next call of op fail with err (calls queue up).
func (r *Runtime) FailNext(op Op, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[op] = append(r.faults[op], err)
}

// Calls counts the calls of op so far (including failed ones).
func (r *Runtime) Calls(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[op]
}

// enter counts a call and pops its injected fault; r.mu is held.
func (r *Runtime) enter(op Op) error {
	r.calls[op]++
	q := r.faults[op]
	if len(q) == 0 {
		return nil
	}
	r.faults[op] = q[1:]
	return q[0]
}

func validID(id string) error {
	if !sandbox.ValidID(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	return nil
}

func (r *Runtime) Name() string { return r.opts.Name }

func (r *Runtime) Capabilities(ctx context.Context) runtime.Capabilities {
	return runtime.Capabilities{
		Checkpoint:       !r.opts.NoCheckpoint,
		CheckpointReason: r.opts.CheckpointReason,
		Freeze:           !r.opts.NoFreeze,
	}
}

// checkSpec rejects what a real backend could not start.
func checkSpec(spec runtime.Spec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if !filepath.IsAbs(spec.BundleDir) {
		return errs.Field("bundle_dir", "must be an absolute path, got %q", spec.BundleDir)
	}
	if len(spec.Args) == 0 {
		return errs.Field("args", "PID 1 needs a command")
	}
	if fi, err := os.Stat(spec.RootFS); err != nil || !fi.IsDir() {
		return errs.E(errs.Internal, "root filesystem %q of %s is not a directory", spec.RootFS, spec.ID)
	}
	for _, m := range spec.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return errs.Wrap(errs.Internal, err, "mount source of %s", m.Target)
		}
	}
	return nil
}

func (r *Runtime) Run(ctx context.Context, spec runtime.Spec) error {
	return r.start(ctx, OpRun, spec, nil)
}

func (r *Runtime) start(ctx context.Context, op Op, spec runtime.Spec, img *image) error {
	r.mu.Lock()
	if err := r.enter(op); err != nil {
		r.mu.Unlock()
		return err
	}
	if err := checkSpec(spec); err != nil {
		r.mu.Unlock()
		return err
	}
	if _, ok := r.boxes[spec.ID]; ok {
		r.mu.Unlock()
		return errs.E(errs.AlreadyExists, "container %s already exists", spec.ID)
	}
	now := r.opts.Now()
	r.nextPid++
	b := &box{spec: spec, state: "running", pid: r.nextPid, created: now, started: now, memory: map[string]string{}}
	var from *runtime.Spec
	if img != nil {
		b.memory = maps.Clone(img.Memory)
		if b.memory == nil {
			b.memory = map[string]string{}
		}
		from = &img.Spec
	}
	r.boxes[spec.ID] = b
	r.mu.Unlock()

	if r.opts.Boot == nil {
		return nil
	}
	stop, err := r.opts.Boot(ctx, spec, from)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.boxes[spec.ID] == b {
			delete(r.boxes, spec.ID)
		}
		if stop != nil {
			go stop()
		}
		return errs.Wrap(errs.KindOf(err), err, "start %s", spec.ID)
	}
	if b.state == "running" || b.state == "paused" {
		b.stop = stop
	} else if stop != nil {
		go stop() // killed while booting
	}
	return nil
}

// halt marks b stopped and returns its PID 1's stop function; r.mu is held.
func (r *Runtime) halt(b *box) func() {
	if b.state == "running" {
		b.cpu += r.opts.Now().Sub(b.started)
	}
	b.state = "stopped"
	stop := b.stop
	b.stop = nil
	return stop
}

func run(f func()) {
	if f != nil {
		f()
	}
}

func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enter(OpState); err != nil {
		return runtime.Status{}, err
	}
	if err := validID(id); err != nil {
		return runtime.Status{}, err
	}
	b, ok := r.boxes[id]
	if !ok {
		return runtime.Status{}, errs.E(errs.NotFound, "container %s does not exist", id)
	}
	return b.status(), nil
}

func (b *box) status() runtime.Status {
	st := runtime.Status{ID: b.spec.ID, State: b.state, Created: b.created}
	if b.state != "stopped" {
		st.Pid = b.pid
	}
	return st
}

func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enter(OpList); err != nil {
		return nil, err
	}
	out := make([]runtime.Status, 0, len(r.boxes))
	for _, b := range r.boxes {
		out = append(out, b.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// lookup returns the box of id; r.mu is held.
func (r *Runtime) lookup(id string) (*box, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	b, ok := r.boxes[id]
	if !ok {
		return nil, errs.E(errs.NotFound, "container %s does not exist", id)
	}
	return b, nil
}

// Kill delivers sig to PID 1: SIGKILL, SIGTERM and SIGINT stop it (the
// agent exits on SIGTERM), signal 0 only checks that it lives, others go
// to Options.Signal. A stopped or missing container cannot be signalled.
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal) error {
	r.mu.Lock()
	if err := r.enter(OpKill); err != nil {
		r.mu.Unlock()
		return err
	}
	b, err := r.lookup(id)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	if b.state == "stopped" {
		r.mu.Unlock()
		return errs.E(errs.FailedPrecondition, "container %s is not running", id)
	}
	var stop func()
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM, syscall.SIGINT:
		stop = r.halt(b)
	case 0:
	default:
		if h := r.opts.Signal; h != nil {
			stop = func() { h(id, sig) }
		}
	}
	r.mu.Unlock()
	run(stop)
	return nil
}

func (r *Runtime) Delete(ctx context.Context, id string) error {
	r.mu.Lock()
	if err := r.enter(OpDelete); err != nil {
		r.mu.Unlock()
		return err
	}
	if err := validID(id); err != nil {
		r.mu.Unlock()
		return err
	}
	b, ok := r.boxes[id]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	stop := r.halt(b)
	delete(r.boxes, id)
	r.mu.Unlock()
	run(stop)
	return nil
}

func (r *Runtime) Freeze(ctx context.Context, id string) error {
	return r.setPaused(OpFreeze, id, true)
}

func (r *Runtime) Thaw(ctx context.Context, id string) error {
	return r.setPaused(OpThaw, id, false)
}

func (r *Runtime) setPaused(op Op, id string, paused bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enter(op); err != nil {
		return err
	}
	if r.opts.NoFreeze {
		return errs.E(errs.FailedPrecondition, "%s cannot freeze on this host", r.opts.Name)
	}
	b, err := r.lookup(id)
	if err != nil {
		return err
	}
	now := r.opts.Now()
	switch {
	case paused && b.state == "running":
		b.cpu += now.Sub(b.started)
		b.state = "paused"
	case !paused && b.state == "paused":
		b.started = now
		b.state = "running"
	case paused && b.state == "paused", !paused && b.state == "running":
	default:
		return errs.E(errs.FailedPrecondition, "container %s is %s", id, b.state)
	}
	return nil
}

// Checkpoint writes the container's spec and memory to imageDir and stops
// it; it stays listed (as runsc's do) until Delete.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string) error {
	r.mu.Lock()
	if err := r.enter(OpCheckpoint); err != nil {
		r.mu.Unlock()
		return err
	}
	if err := validID(id); err != nil {
		r.mu.Unlock()
		return err
	}
	if !filepath.IsAbs(imageDir) {
		r.mu.Unlock()
		return errs.Field("image_dir", "must be an absolute path, got %q", imageDir)
	}
	if r.opts.NoCheckpoint {
		r.mu.Unlock()
		return errs.E(errs.FailedPrecondition, "%s cannot checkpoint on this host: %s", r.opts.Name, r.opts.CheckpointReason)
	}
	b, err := r.lookup(id)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	if b.state == "stopped" {
		r.mu.Unlock()
		return errs.E(errs.FailedPrecondition, "container %s is not running", id)
	}
	data, err := json.Marshal(image{Spec: b.spec, Memory: b.memory, Taken: r.opts.Now()})
	if err == nil {
		err = writeImage(imageDir, data)
	}
	if err != nil {
		r.mu.Unlock()
		return errs.Wrap(errs.Internal, err, "write memory image of %s", id)
	}
	stop := r.halt(b)
	r.mu.Unlock()
	run(stop)
	return nil
}

func writeImage(dir string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ImageFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ImageFile))
}

// Restore starts spec.ID from the image in imageDir with the memory it
// holds; the spec's command must be the checkpointed one.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if !filepath.IsAbs(imageDir) {
		return errs.Field("image_dir", "must be an absolute path, got %q", imageDir)
	}
	if r.opts.NoCheckpoint {
		r.mu.Lock()
		err := r.enter(OpRestore)
		r.mu.Unlock()
		if err != nil {
			return err
		}
		return errs.E(errs.FailedPrecondition, "%s cannot restore on this host: %s", r.opts.Name, r.opts.CheckpointReason)
	}
	data, err := os.ReadFile(filepath.Join(imageDir, ImageFile))
	if err != nil {
		r.mu.Lock()
		ferr := r.enter(OpRestore)
		r.mu.Unlock()
		if ferr != nil {
			return ferr
		}
		if errors.Is(err, os.ErrNotExist) {
			return errs.Wrap(errs.NotFound, err, "memory image")
		}
		return errs.Wrap(errs.Internal, err, "memory image")
	}
	var img image
	if err := json.Unmarshal(data, &img); err != nil {
		return errs.Wrap(errs.Internal, err, "decode memory image %s", imageDir)
	}
	if !equalArgs(img.Spec.Args, spec.Args) {
		return errs.E(errs.FailedPrecondition, "restore of %s: PID 1 %q does not match the image's %q", spec.ID, spec.Args, img.Spec.Args)
	}
	return r.start(ctx, OpRestore, spec, &img)
}

func equalArgs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Stats reports synthetic accounting: CPU is the time the container has
// run on the runtime's clock (at least 1ns), one pid, 1 MiB of memory.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enter(OpStats); err != nil {
		return runtime.Stats{}, err
	}
	b, err := r.lookup(id)
	if err != nil {
		return runtime.Stats{}, err
	}
	cpu := b.cpu
	if b.state == "running" {
		cpu += r.opts.Now().Sub(b.started)
	}
	st := runtime.Stats{CPUUsageNanos: uint64(max(cpu, 1)), MemoryBytes: 1 << 20, MemoryPeak: 1 << 20}
	if b.state != "stopped" {
		st.Pids = 1
	}
	st.OOMKills = b.ooms
	return st, nil
}

// Exit makes a running container's PID 1 exit, as if it died on its own.
func (r *Runtime) Exit(id string) error {
	r.mu.Lock()
	b, err := r.lookup(id)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	stop := r.halt(b)
	r.mu.Unlock()
	run(stop)
	return nil
}

// OOMKill records one OOM kill inside the container (Stats.OOMKills).
func (r *Runtime) OOMKill(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.lookup(id)
	if err != nil {
		return err
	}
	b.ooms++
	return nil
}

// SetMemory stores a value in the container's memory, which a checkpoint
// keeps and a restore brings back.
func (r *Runtime) SetMemory(id, key, value string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.lookup(id)
	if err != nil {
		return err
	}
	if b.state == "stopped" {
		return errs.E(errs.FailedPrecondition, "container %s is not running", id)
	}
	b.memory[key] = value
	return nil
}

// Memory reads a value from the container's memory.
func (r *Runtime) Memory(id, key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok {
		return "", false
	}
	v, ok := b.memory[key]
	return v, ok
}

// Spec returns the spec a container was started with.
func (r *Runtime) Spec(id string) (runtime.Spec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok {
		return runtime.Spec{}, false
	}
	return b.spec, true
}
