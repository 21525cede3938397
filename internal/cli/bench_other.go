//go:build !linux

package cli

import (
	"runtime"

	"github.com/berth-dev/berth/internal/errs"
)

// runBench: the bench's baselines (raw runtimes, host fork+exec, cgroup
// memory) and --self need Linux.
func runBench(e *env, args []string) error {
	return errs.E(errs.NotImplemented, "berth bench runs on Linux only (this is %s/%s)", runtime.GOOS, runtime.GOARCH)
}
