package lineage

import (
	"context"
	"io"
	"sync/atomic"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// MaxReadBytes bounds the file content one view gives out (digests and
// text of changed files). A sandbox can make a file of terabytes that
// holds no blocks (sparse); hashing it would read zeros for hours. Past
// the bound a read is ResourceExhausted.
const MaxReadBytes = 4 << 30

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
