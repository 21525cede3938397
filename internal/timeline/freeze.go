package timeline

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/runtime"
)

// canFreeze asks only what is known now: runc's capabilities otherwise
// wait for its trial checkpoint, which a freeze does not need.
func canFreeze(ctx context.Context, rt runtime.Runtime) bool {
	now, cancel := context.WithCancel(ctx)
	cancel()
	return rt.Capabilities(now).Freeze
}

// initKiller is a runtime that can end a container's processes by
// killing its PID 1 directly and waiting for it, without an exec of the
// runtime (oci.OCI, for runc).
type initKiller interface {
	KillInit(ctx context.Context, id string, wait time.Duration) error
}
