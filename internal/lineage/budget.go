package lineage

import (
	"context"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// Bounds of what a view reads. A sandbox can make a file of terabytes that
// holds no blocks (sparse): hashing it would read zeros for hours while
// the disk limit, which bounds every real byte, never notices. So a file
// whose holes exceed MaxHoleBytes is refused before it is read
// (ResourceExhausted), and MaxReadBytes bounds all content one view gives
// out (digests and text of changed files) whatever the disk limit is.
const (
	MaxHoleBytes = 1 << 30
	MaxReadBytes = 64 << 30
)

// readBudget is what a view may still read; it is shared by the view's
// directory layers.
type readBudget struct {
	left atomic.Int64
}

func newBudget(n int64) *readBudget {
	b := &readBudget{}
	b.left.Store(n)
	return b
}

// boundedLayer is a directory layer whose reads draw on a budget and
// stop when the request's context ends.
type boundedLayer struct {
	fsdiff.Layer
	b   *readBudget
	ctx context.Context
}

func (l boundedLayer) Open(rel string) (io.ReadCloser, error) {
	rc, err := l.Layer.Open(rel)
	if err != nil {
		return nil, err
	}
	if f, ok := rc.(*os.File); ok {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err == nil {
			if holes := st.Size - st.Blocks*512; holes > MaxHoleBytes {
				rc.Close()
				return nil, errs.E(errs.ResourceExhausted, "%q is a sparse file of %d bytes holding %d: it is not read; narrow the diff to other paths", rel, st.Size, st.Blocks*512)
			}
		}
	}
	return &boundedReader{rc: rc, l: l, rel: rel}, nil
}

type boundedReader struct {
	rc  io.ReadCloser
	l   boundedLayer
	rel string
}

func (r *boundedReader) Read(p []byte) (int, error) {
	if err := r.l.ctx.Err(); err != nil {
		return 0, err
	}
	if len(p) > 1<<20 {
		p = p[:1<<20]
	}
	n, err := r.rc.Read(p)
	if r.l.b.left.Add(-int64(n)) < 0 {
		return 0, errs.E(errs.ResourceExhausted, "the diff would read more than %d bytes of file content (at %q): narrow it to paths", int64(MaxReadBytes), r.rel)
	}
	return n, err
}

func (r *boundedReader) Close() error { return r.rc.Close() }
