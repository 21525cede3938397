package agentapi

import (
	"bytes"
	"io"

	"github.com/berth-dev/berth/internal/errs"
)

// maxWatchLine bounds one NDJSON line of a watch stream. Events are small
// (a name, and an entry with IncludeEntry); the agent is inside the sandbox
// and may send anything, so a line beyond this ends the stream instead of
// growing the daemon's buffer.
const maxWatchLine = 64 << 10

// lineLimiter passes r through, failing once a line (bytes since the last
// '\n') exceeds max.
type lineLimiter struct {
	r    io.Reader
	max  int
	line int
}

func newLineLimiter(r io.Reader, max int) *lineLimiter { return &lineLimiter{r: r, max: max} }

func (l *lineLimiter) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for b := p[:n]; len(b) > 0; {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			l.line += len(b)
			break
		}
		l.line += i
		if l.line > l.max {
			break
		}
		l.line = 0
		b = b[i+1:]
	}
	if l.line > l.max {
		return 0, errs.E(errs.ResourceExhausted, "agent stream line longer than %d bytes", l.max)
	}
	return n, err
}
