package timeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// CheckpointRequest asks for a checkpoint of a running sandbox.
type CheckpointRequest struct {
	Owner  string // "" = admin
	Actor  string
	ID     string // the sandbox
	Name   string // optional, unique on the sandbox's timeline
	Memory bool   // a memory image too, where the runtime can take one
}

// Checkpoint puts a point on a running sandbox's timeline: a delta layer
// of what changed since the previous point (the sandbox frozen for the
// copy, or stopped for its memory image) and, when asked and the runtime
// can, a memory image. The sandbox keeps running. The event says which
// mode it got and, when memory was asked for and not taken, why.
func (s *Service) Checkpoint(ctx context.Context, req CheckpointRequest) (store.Checkpoint, error) {
	if req.Name != "" {
		if err := validName(req.Name); err != nil {
			return store.Checkpoint{}, err
		}
	}
	unlock := s.core.Lock(req.ID)
	defer unlock()
	sb, err := s.core.Visible(ctx, req.Owner, req.ID)
	if err != nil {
		return store.Checkpoint{}, err
	}
	if sb.State != sandbox.Running {
		return store.Checkpoint{}, errs.E(errs.Conflict, "sandbox %s is %s; only a running sandbox can be checkpointed", sb.ID, sb.State)
	}
	if req.Name != "" {
		list, err := s.core.Store().ListCheckpoints(ctx, sb.ID)
		if err != nil {
			return store.Checkpoint{}, err
		}
		if c, err := resolve(list, req.Name, "name"); err == nil {
			return store.Checkpoint{}, errs.Field("name", "sandbox %s already has a checkpoint named %q (%s)", sb.ID, req.Name, c.ID)
		}
	}
	release, err := s.core.ReserveSnapshot(ctx, sb.Owner) // checkpoints count in the snapshot quota
	if err != nil {
		return store.Checkpoint{}, err
	}
	defer release()
	boot, err := s.core.BootLayers(ctx, sb)
	if err != nil {
		return store.Checkpoint{}, err
	}
	var head *store.TimelineHead
	if h, err := s.core.Store().GetTimelineHead(ctx, sb.ID); err == nil {
		head = &h
	} else if !errs.Is(err, errs.NotFound) {
		return store.Checkpoint{}, err
	}
	base, prev := deltaBase(head, boot)
	id := sandbox.NewID()
	start := time.Now()
	var (
		layer template.Layer
		ds    DeltaStat
	)
	capture := func(ctx context.Context, running bool) error {
		var err error
		layer, ds, err = s.captureDelta(ctx, sb, id, base, boot, running)
		return err
	}
	mode, reason, memPath := ModeFiles, "", ""
	if req.Memory {
		img := s.memoryDir(id)
		if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
			return store.Checkpoint{}, errs.Wrap(errs.Internal, err, "create checkpoint dir")
		}
		mem, why, err := s.core.CheckpointRunning(ctx, sb, img, capture)
		if err != nil || layer.Digest == "" {
			_ = os.RemoveAll(filepath.Dir(img))
			if err == nil {
				err = errs.E(errs.Internal, "checkpoint of %s captured no files", sb.ID)
			}
			return store.Checkpoint{}, err
		}
		if mem {
			mode, memPath = ModeMemory, img
		} else {
			reason = why
			_ = os.RemoveAll(filepath.Dir(img))
		}
	} else if err := capture(ctx, true); err != nil {
		return store.Checkpoint{}, err
	}
	captured := time.Now()
	ck, err := s.core.Store().CreateCheckpoint(ctx, store.Checkpoint{
		ID: id, Sandbox: sb.ID, Owner: sb.Owner, Name: req.Name, Layer: layer.Digest,
		Layers: append([]string{layer.Digest}, base...), Prev: prev, Runtime: sb.Runtime,
		MemoryPath: memPath, Mode: mode, Reason: reason, Bytes: ds.Bytes, Entries: layer.Entries,
		CreatedAt: s.core.Now().UTC(),
	})
	if err != nil {
		_ = os.RemoveAll(filepath.Join(s.cfg.DataDir, "checkpoints", id))
		if errs.Is(err, errs.AlreadyExists) {
			return store.Checkpoint{}, errs.Field("name", "sandbox %s already has a checkpoint named %q", sb.ID, req.Name)
		}
		return store.Checkpoint{}, err
	}
	if err := s.core.Store().SetTimelineHead(ctx, store.TimelineHead{Sandbox: sb.ID, Checkpoint: ck.ID, Layers: ck.Layers}); err != nil {
		return store.Checkpoint{}, err
	}
	took := time.Since(start)
	storeMillis := time.Since(captured).Milliseconds()
	requested := ModeFiles
	if req.Memory {
		requested = ModeMemory
	}
	data := map[string]string{
		"checkpoint": ck.ID, "seq": strconv.FormatInt(ck.Seq, 10), "layer": ck.Layer, "prev": prev,
		"mode": mode, "requested": requested, "bytes": strconv.FormatInt(ds.Bytes, 10),
		"files": strconv.Itoa(ds.Files), "whiteouts": strconv.Itoa(ds.Whiteouts), "ms": strconv.FormatInt(took.Milliseconds(), 10),
		"freeze_ms": strconv.FormatInt(ds.FreezeMillis, 10), "store_ms": strconv.FormatInt(storeMillis, 10),
		"diff_ms": strconv.FormatInt(ds.DiffMillis, 10), "write_ms": strconv.FormatInt(ds.WriteMillis, 10),
		"import_ms": strconv.FormatInt(ds.ImportMillis, 10), "thaw_ms": strconv.FormatInt(ds.ThawMillis, 10),
	}
	if len(ds.Refused) > 0 {
		data["refused"] = strconv.Itoa(len(ds.Refused))
	}
	s.core.Event(ctx, sb, req.Actor, "checkpoint", "checkpoint_taken", reason, data)
	s.log.Info("checkpoint taken", "sandbox_id", sb.ID, "checkpoint", ck.ID, "mode", mode, "bytes", ds.Bytes, "ms", took.Milliseconds(),
		"freeze_ms", ds.FreezeMillis, "diff_ms", ds.DiffMillis, "write_ms", ds.WriteMillis, "import_ms", ds.ImportMillis, "thaw_ms", ds.ThawMillis, "store_ms", storeMillis)
	return ck, nil
}

// checkpointXattr names the checkpoint on its delta layer's root (a
// trusted.* name: only host root reads it; overlayfs ignores all but
// trusted.overlay.*, and the root of a lower is never what a sandbox sees).
const checkpointXattr = "trusted.berth.checkpoint"

// isDeltaLayer reports whether the layer at dir is a checkpoint's delta
// (its root carries checkpointXattr).
func isDeltaLayer(dir string) bool {
	_, err := unix.Getxattr(dir, checkpointXattr, nil)
	return err == nil
}

// captureDelta writes the delta from view base to sb's live view (its
// upper over boot) as a layer. A running sandbox is frozen for the diff
// and the copy, so the delta is one instant and no file moves under it.
func (s *Service) captureDelta(ctx context.Context, sb *sandbox.Sandbox, id string, base, boot []string, running bool) (_ template.Layer, ds DeltaStat, _ error) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return template.Layer{}, DeltaStat{}, err
	}
	began := time.Now()
	if running && canFreeze(ctx, rt) {
		// runc: the freezer cgroup written directly; runsc: its Sentry asked over the control socket
		// (internal/runtime/oci/freezer_linux.go, runscctl_linux.go).
		if err := rt.Freeze(ctx, sb.ID); err != nil {
			return template.Layer{}, DeltaStat{}, errs.Wrap(errs.Internal, err, "freeze %s for a consistent checkpoint", sb.ID)
		}
		defer func() {
			t := time.Now()
			if err := rt.Thaw(context.WithoutCancel(ctx), sb.ID); err != nil {
				s.log.Error("thaw after checkpoint", "sandbox_id", sb.ID, "err", err)
			}
			ds.ThawMillis = time.Since(t).Milliseconds()
		}()
	}
	t0 := time.Now()
	var open []*fsdiff.DirLayer
	defer func() {
		for _, l := range open {
			l.Close()
		}
	}()
	from, err := s.view(&open, base)
	if err != nil {
		return template.Layer{}, DeltaStat{}, err
	}
	upper, err := fsdiff.OpenDirLayer(rootfs.LayoutOf(s.core.SandboxDir(sb.ID)).Upper, "upper:"+sb.ID, s.core.UserNS(sb).Unshift)
	if err != nil {
		return template.Layer{}, DeltaStat{}, errs.Wrap(errs.Internal, err, "open the upper of %s", sb.ID)
	}
	open = append(open, upper)
	lowers, err := s.layersOf(&open, boot)
	if err != nil {
		return template.Layer{}, DeltaStat{}, err
	}
	to := fsdiff.NewTree(append([]fsdiff.Layer{upper}, lowers...)...)
	// QuickCheck: the from side is layers berth wrote, so a file the last
	// delta copied and nobody touched since is known by its stamp, and any
	// other file of equal size counts as modified (copied again: more
	// bytes, never a wrong view) — no content is read to decide.
	res, err := fsdiff.Diff(ctx, fsdiff.NewTree(from...), to, fsdiff.Options{DigestsOnly: true, NoText: true, QuickCheck: true})
	if err != nil {
		return template.Layer{}, DeltaStat{}, err
	}
	t1 := time.Now()
	var t2 time.Time
	l, err := s.layers.ImportDirNamed(ctx, deltaName(id, res.Changes), func(dir string) error {
		var err error
		ds, err = WriteDeltaStamped(ctx, res, to, dir, began)
		t2 = time.Now()
		if err != nil {
			return err
		}
		// The checkpoint's id on the layer's root says whose delta it is
		// (its name is a digest and says nothing to a reader).
		return unix.Setxattr(dir, checkpointXattr, []byte(id), 0)
	})
	ds.FreezeMillis = t0.Sub(began).Milliseconds()
	ds.DiffMillis, ds.WriteMillis, ds.ImportMillis = t1.Sub(t0).Milliseconds(), t2.Sub(t1).Milliseconds(), time.Since(t2).Milliseconds()
	return l, ds, err
}

// deltaDomain separates delta names from every other digest of the layer
// store.
const deltaDomain = "berth timeline delta v1\x00"

// deltaName is the layer name of checkpoint id's delta: the SHA-256 of a
// domain tag, the checkpoint's id and the delta's entry list (each
// change's path, kind and the new object's type, mode, owner, size and
// symlink target). Not a digest of the delta's bytes — computing one would
// read every byte the delta holds (100 MiB for a rewritten 100 MiB file)
// — and it need not be one:
//   - it is unique: the checkpoint id is fresh (sandbox.NewID, random), so
//     no two deltas share a name, which is what overlayfs needs (it
//     refuses a lower twice in one view) and what content naming had to be
//     bent for before (two deltas of the same changes);
//   - it cannot be any other layer's name: content digests (ImportTar's
//     tar stream, ImportDir's TreeDigest) hash other inputs, and meeting
//     one would be a SHA-256 collision; the domain tag keeps even the
//     inputs apart;
//   - nothing trusts a layer's name as a statement about its bytes: the
//     layer store, layer GC (CollectLayers, by reference), RemoveLayer and
//     the timeline's own dropLayers address layers by name only; the bytes
//     are as safe as every layer's are, in the root-only layer store,
//     written once by berth and never changed.
//
// The entry list is in it so that the name also commits to the delta's
// shape (a reader with the checkpoint id and the layer can recompute it).
func deltaName(id string, changes []fsdiff.Change) string {
	h := sha256.New()
	h.Write([]byte(deltaDomain))
	h.Write([]byte(id))
	h.Write([]byte{0})
	for _, c := range changes {
		fmt.Fprintf(h, "%q %s", c.Path, c.Kind)
		if n := c.New; n != nil {
			fmt.Fprintf(h, " %s %o %d:%d %d %q", n.Type, n.Mode, n.UID, n.GID, n.Size, n.Target)
		}
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// view opens the stored layers digests (top first).
func (s *Service) view(open *[]*fsdiff.DirLayer, digests []string) ([]fsdiff.Layer, error) {
	return s.layersOf(open, digests)
}

func (s *Service) layersOf(open *[]*fsdiff.DirLayer, digests []string) ([]fsdiff.Layer, error) {
	out := make([]fsdiff.Layer, 0, len(digests))
	for _, dg := range digests {
		l, err := fsdiff.OpenDirLayer(s.layers.LayerPath(dg), dg, nil)
		if err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %s is missing", dg)
		}
		*open = append(*open, l)
		out = append(out, l)
	}
	return out, nil
}

// lowerPaths resolves layer digests to host paths.
func (s *Service) lowerPaths(digests []string) ([]string, error) {
	out := make([]string, 0, len(digests))
	for _, dg := range digests {
		p := s.layers.LayerPath(dg)
		if _, err := os.Stat(p); err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %s is missing", dg)
		}
		out = append(out, p)
	}
	return out, nil
}

// List returns a sandbox's timeline, oldest first.
func (s *Service) List(ctx context.Context, owner, id string) ([]store.Checkpoint, *store.TimelineHead, error) {
	sb, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	list, err := s.core.Store().ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, nil, err
	}
	h, err := s.core.Store().GetTimelineHead(ctx, sb.ID)
	if errs.Is(err, errs.NotFound) {
		return list, nil, nil
	}
	return list, &h, err
}

// Get returns checkpoint ref (id, name or seq) of sandbox id.
func (s *Service) Get(ctx context.Context, owner, id, ref string) (store.Checkpoint, error) {
	list, _, err := s.List(ctx, owner, id)
	if err != nil {
		return store.Checkpoint{}, err
	}
	return resolve(list, ref, "checkpoint")
}

// CheckpointLayers is the view of a checkpoint (its layers, top first):
// what `berth diff A --checkpoint C` compares A against.
func (s *Service) CheckpointLayers(ctx context.Context, sandboxID, checkpointID string) ([]string, error) {
	list, err := s.core.Store().ListCheckpoints(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	c, err := resolve(list, checkpointID, "checkpoint")
	if err != nil {
		return nil, err
	}
	return c.Layers, nil
}

// Delete removes one checkpoint from a sandbox's timeline: its row, its
// memory image, and its delta layer unless a later checkpoint, the
// sandbox's own layers (after a rewind) or anything else still stacks on it.
func (s *Service) Delete(ctx context.Context, owner, id, ref string) error {
	unlock := s.core.Lock(id)
	defer unlock()
	sb, err := s.core.Visible(ctx, owner, id)
	if err != nil {
		return err
	}
	list, err := s.core.Store().ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return err
	}
	c, err := resolve(list, ref, "checkpoint")
	if err != nil {
		return err
	}
	if err := s.core.Store().DeleteCheckpoint(ctx, c.ID); err != nil {
		return err
	}
	_ = os.RemoveAll(filepath.Join(s.cfg.DataDir, "checkpoints", c.ID))
	s.dropLayers(ctx, "", []string{c.Layer})
	s.core.Event(ctx, sb, owner, "checkpoint", "checkpoint_deleted", "", map[string]string{"checkpoint": c.ID, "seq": strconv.FormatInt(c.Seq, 10)})
	return nil
}

// Forget removes a sandbox's whole timeline (called by the core's delete
// while it holds the sandbox's lock, before the sandbox's row goes):
// checkpoints, head, memory images, and the delta layers nothing else uses.
func (s *Service) Forget(ctx context.Context, id string) error {
	list, err := s.core.Store().ListCheckpoints(ctx, id)
	if err != nil {
		return err
	}
	var errList []error
	var layers []string
	for _, c := range list {
		if err := s.core.Store().DeleteCheckpoint(ctx, c.ID); err != nil && !errs.Is(err, errs.NotFound) {
			errList = append(errList, err)
			continue
		}
		_ = os.RemoveAll(filepath.Join(s.cfg.DataDir, "checkpoints", c.ID))
		layers = append(layers, c.Layer)
	}
	// The head's and the sandbox's own stacks also hold template, snapshot
	// and build layers: dropLayers removes only the delta layers among them.
	if h, err := s.core.Store().GetTimelineHead(ctx, id); err == nil {
		layers = append(layers, h.Layers...)
		if err := s.core.Store().DeleteTimelineHead(ctx, id); err != nil && !errs.Is(err, errs.NotFound) {
			errList = append(errList, err)
		}
	}
	if sb, err := s.core.Store().GetSandbox(ctx, id); err == nil {
		layers = append(layers, sb.Layers...) // a rewound sandbox runs on delta layers
	}
	s.dropLayers(ctx, id, layers)
	return errors.Join(errList...)
}

// dropLayers removes those of layers that no template, snapshot, sandbox
// (but except), checkpoint, timeline head or mounted overlay uses any more.
func (s *Service) dropLayers(ctx context.Context, except string, layers []string) {
	// Only the timeline's own delta layers are its to drop. A sandbox's
	// other layers are a template's (or a snapshot's): layer GC owns them,
	// and a template build in progress holds GC off while its new layers
	// are named by no record yet (its step sandboxes run on them and are
	// deleted before the template row names them). Most deletes have no
	// delta layer: they read neither the records nor mountinfo.
	var deltas []string
	for _, dg := range layers {
		if isDeltaLayer(s.layers.LayerPath(dg)) {
			deltas = append(deltas, dg)
		}
	}
	if len(deltas) == 0 {
		return
	}
	refs, err := s.refs(ctx, except)
	if err != nil {
		s.log.Warn("timeline: layer references", "err", err)
		return
	}
	// A sandbox whose layers no record names (one from before pins, on a
	// rebuilt template) still has them in its overlay mount, as layer GC
	// knows (template.Service.CollectLayers).
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		s.log.Warn("timeline: read mounts", "err", err)
		return
	}
	for _, dg := range deltas {
		if refs.used(dg) || strings.Contains(string(mounts), s.layers.LayerPath(dg)) {
			continue
		}
		if err := s.layers.RemoveLayer(dg); err != nil && !errs.Is(err, errs.NotFound) {
			s.log.Warn("timeline: remove delta layer", "layer", dg, "err", err)
		}
	}
}

func (s *Service) refs(ctx context.Context, except string) (layerRefs, error) {
	var r layerRefs
	st := s.core.Store()
	tpls, err := st.ListTemplates(ctx)
	if err != nil {
		return r, err
	}
	for _, t := range tpls {
		r.templates = append(r.templates, t.Layers)
	}
	sns, err := st.ListSnapshots(ctx, "")
	if err != nil {
		return r, err
	}
	for _, sn := range sns {
		r.snapshots = append(r.snapshots, sn.Layers)
	}
	sbs, _, err := st.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return r, err
	}
	for _, sb := range sbs {
		if sb.ID != except && sb.State != sandbox.Deleted {
			r.sandboxes = append(r.sandboxes, sb.Layers)
		}
	}
	cks, err := st.ListCheckpoints(ctx, "")
	if err != nil {
		return r, err
	}
	for _, c := range cks {
		if c.Sandbox != except {
			r.checkpoints = append(r.checkpoints, c.Layers)
		}
	}
	heads, err := st.ListTimelineHeads(ctx)
	if err != nil {
		return r, err
	}
	for _, h := range heads {
		if h.Sandbox != except {
			r.heads = append(r.heads, h.Layers)
		}
	}
	return r, nil
}

// PinnedLayers is every layer the timeline keeps (checkpoints' views and
// timeline heads): layer GC must not collect them.
func (s *Service) PinnedLayers(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	cks, err := s.core.Store().ListCheckpoints(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, c := range cks {
		for _, l := range c.Layers {
			out[l] = true
		}
	}
	heads, err := s.core.Store().ListTimelineHeads(ctx)
	if err != nil {
		return nil, err
	}
	for _, h := range heads {
		for _, l := range h.Layers {
			out[l] = true
		}
	}
	return out, nil
}
