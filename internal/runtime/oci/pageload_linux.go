package oci

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// A runsc memory restore runs with --background: `runsc restore` returns
// once the kernel's state is loaded, and the Sentry keeps reading memory
// pages from the image while the sandbox already runs (a page touched
// before it is loaded is loaded first). What that means for the image,
// from gVisor's runsc/sandbox and runsc/boot/restore.go:
//   - `runsc restore` opens the image files and hands their descriptors to
//     the Sentry; after it returns nothing reads the image by path, so a
//     rename or unlink of the path does not disturb the load — but writing
//     the same inodes would, and the disk space stays used until the load
//     ends. Berth never writes an image in place (a checkpoint goes to a
//     fresh directory) and keeps the image until the load is over.
//   - Several restores of one image (a fork) each read it on their own
//     descriptors, concurrently; nothing is shared or locked.
//   - The load ends in the Sentry's postRestore: on success the restore is
//     marked done; on a read error it is marked failed and the Sentry
//     SIGKILLs every process (the container's init exits).
//     `runsc wait --restore ID` blocks until then and fails with the error.
//
// lazyRestoreMinBytes is the smallest pages file restored lazily. A page
// the sandbox touches before the loader reached it is read on its own (a
// small direct read while the loader streams the rest), so for a small
// image — a fork's, restored by several children at once — loading it
// whole first costs less than it saves; from a few hundred MiB on, the
// first output no longer waits for the whole image.
const lazyRestoreMinBytes = 256 << 20

// lazyRestore reports whether the runsc image in imageDir is restored with
// --background: it has a pages file (berth's checkpoints are uncompressed)
// of at least lazyRestoreMinBytes.
func lazyRestore(imageDir string) bool {
	fi, err := os.Stat(filepath.Join(imageDir, "pages.img"))
	return err == nil && fi.Size() >= lazyRestoreMinBytes
}

// pageLoads tracks, per container, the `runsc wait --restore` that says
// when its load is over.
type pageLoads struct {
	mu sync.Mutex
	m  map[string]*pageLoad
}

type pageLoad struct {
	image   string
	started time.Time
	cancel  context.CancelFunc
	done    chan struct{} // closed when err is set
	err     error
	deleted bool // Delete ended the container while it loaded
}

// trackPageLoad starts watching the background page load of container id,
// restored from image.
func (o *OCI) trackPageLoad(id, image string) {
	ctx, cancel := context.WithCancel(context.Background())
	l := &pageLoad{image: image, started: time.Now(), cancel: cancel, done: make(chan struct{})}
	o.loads.mu.Lock()
	if o.loads.m == nil {
		o.loads.m = map[string]*pageLoad{}
	}
	if old := o.loads.m[id]; old != nil {
		// A restore under an id whose previous container is gone (Delete
		// cancelled its watch): that watch is over or ending.
		old.cancel()
	}
	o.loads.m[id] = l
	o.loads.mu.Unlock()
	go func() {
		_, err := o.exec(ctx, false, "wait-restore", id, "wait", "--restore", id)
		o.loads.mu.Lock()
		if l.deleted || ctx.Err() != nil {
			err = errs.E(errs.NotFound, "container %s was deleted while its memory pages loaded", id)
		} else if err != nil {
			err = errs.Wrap(errs.Internal, err, "loading the memory pages of %s from %s in the background", id, image)
		}
		l.err = err
		if o.loads.m[id] == l {
			delete(o.loads.m, id)
		}
		o.loads.mu.Unlock()
		cancel()
		close(l.done)
		o.log.Debug("memory pages loaded", "sandbox_id", id, "took", time.Since(l.started), "err", err)
	}()
}

// WaitPagesLoaded blocks until container id has read its whole memory
// image (nil at once when no load of it is going on) or ctx ends. An error
// of kind NotFound: the container was deleted meanwhile; another error:
// the load failed and the runtime killed the container's processes.
func (o *OCI) WaitPagesLoaded(ctx context.Context, id string) error {
	o.loads.mu.Lock()
	l := o.loads.m[id]
	o.loads.mu.Unlock()
	if l == nil {
		return nil
	}
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return errs.Wrap(errs.Unavailable, ctx.Err(), "waiting for the memory pages of %s to load", id)
	}
}

// ImageReaders is how many containers still load pages from imageDir.
func (o *OCI) ImageReaders(imageDir string) int {
	o.loads.mu.Lock()
	defer o.loads.mu.Unlock()
	n := 0
	for _, l := range o.loads.m {
		if l.image == imageDir {
			n++
		}
	}
	return n
}

// endPageLoad is Delete's part: the container is gone, so its watch ends
// (its `runsc wait` would otherwise wait on a sandbox that no longer
// answers) and Delete returns only once it has.
func (o *OCI) endPageLoad(id string) {
	o.loads.mu.Lock()
	l := o.loads.m[id]
	if l != nil {
		l.deleted = true
		l.cancel()
	}
	o.loads.mu.Unlock()
	if l != nil {
		<-l.done
	}
}
