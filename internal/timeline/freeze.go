package timeline

import (
	"context"

	"github.com/berth-dev/berth/internal/runtime"
)

// canFreeze asks only what is known now: runc's capabilities otherwise
// wait for its trial checkpoint, which a freeze does not need.
func canFreeze(ctx context.Context, rt runtime.Runtime) bool {
	now, cancel := context.WithCancel(ctx)
	cancel()
	return rt.Capabilities(now).Freeze
}
