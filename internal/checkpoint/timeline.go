package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// What internal/timeline (checkpoints on a timeline, rewind, promote) needs
// of the memory machinery here, as small exports rather than copies: the
// fork's "checkpoint, capture the files, restore the parent" and its
// restoreFrom.

// CheckpointRunning writes a memory image of running sandbox sb (locked by
// the caller) to img and leaves it running — restored from that image, or
// booted from its workspace when the restore fails. capture takes the
// files that go with the image: called once, with running=false while the
// processes are stopped (runc), with running=true while the sandbox runs
// (runsc exports first, as a fork does) or when no image could be taken.
// memory reports whether img holds an image; reason says why not.
func (s *Service) CheckpointRunning(ctx context.Context, sb *sandbox.Sandbox, img string, capture func(ctx context.Context, running bool) error) (memory bool, reason string, err error) {
	tctx, cancel := teardownCtx(ctx)
	defer func() { cancel() }()
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return false, "", err
	}
	plan := planFork(sb.Runtime, rt.Capabilities(tctx), isExporter(rt))
	if !plan.memory {
		return false, plan.reason, capture(tctx, true)
	}
	if plan.exportFirst {
		if err := capture(tctx, true); err != nil {
			return false, "", err
		}
	}
	limit := s.checkpointTimeout(sb)
	cctx, ccancel := context.WithTimeout(tctx, limit)
	err = s.checkpointTo(cctx, sb, img)
	timedOut := err != nil && cctx.Err() != nil
	ccancel()
	if err != nil {
		reason = "memory checkpoint failed: " + errs.Short(err)
		if timedOut {
			reason = fmt.Sprintf("memory checkpoint did not finish within %s; the runtime's checkpoint helper was killed", limit)
		}
		s.log.Warn("checkpoint: memory image failed", "sandbox_id", sb.ID, "err", err)
		_ = os.RemoveAll(img)
		cancel()
		tctx, cancel = teardownCtx(ctx)
		s.thawAfterCheckpoint(tctx, sb)
		if err := s.ensureRunning(tctx, sb, timedOut); err != nil {
			return false, reason, err
		}
		if plan.exportFirst {
			return false, reason, nil
		}
		return false, reason, capture(tctx, true)
	}
	if !plan.exportFirst {
		if err := capture(tctx, false); err != nil {
			_ = os.RemoveAll(img)
			return false, "", errors.Join(err, s.restoreParent(tctx, sb, img))
		}
	}
	if err := s.restoreParent(tctx, sb, img); err != nil {
		return true, "", err
	}
	return true, "", nil
}

// RestoreInto starts sb (locked by the caller, its processes stopped) from
// memory image img on a fresh workspace of diskMiB over lowers (host paths,
// top first), the rootfs the image was taken on. imageOf is the sandbox
// whose agent the image holds when it is not sb (a promoted child): that
// agent is rekeyed to sb's id. The restore count is recorded.
func (s *Service) RestoreInto(ctx context.Context, sb *sandbox.Sandbox, lowers []string, img, imageOf string, diskMiB int64) error {
	if _, err := os.Stat(filepath.Join(img)); err != nil {
		return fmt.Errorf("no memory image: %w", err)
	}
	count := sb.RestoreCount + 1
	if err := s.restoreFrom(ctx, sb, lowers, img, count, imageOf, diskMiB); err != nil {
		return err
	}
	out, err := s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		s.RestoreCount = count
		return nil
	})
	if err == nil {
		sb.RestoreCount = out.RestoreCount
	}
	return err
}

// BootLayers are the layer digests sb boots on, top first (its pinned
// layers, else its template's).
func (s *Snapshots) BootLayers(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	return s.layerDigests(ctx, sb)
}
