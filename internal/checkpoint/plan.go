package checkpoint

import (
	"time"

	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The decisions of a pause or fork, as pure functions of what the runtime
// says it can do: table-tested without a runtime (plan_test.go).

// Timeout bounds one checkpoint or restore of a sandbox with a memory limit
// of memoryMiB: base plus perGiB for each started GiB (the image is at most
// that big).
func Timeout(base, perGiB time.Duration, memoryMiB int64) time.Duration {
	gib := (memoryMiB + 1023) / 1024
	return base + time.Duration(gib)*perGiB
}

// workstationRuntime picks a workstation's runtime when runsc is
// configured: runsc only when it can checkpoint memory and def cannot.
func workstationRuntime(def string, defCan, runscCan bool) string {
	if def == "runsc" || defCan || !runscCan {
		return def
	}
	return "runsc"
}

// defaultMode is the pause mode of a request that names none.
func defaultMode(canCheckpoint bool) sandbox.PauseMode {
	if canCheckpoint {
		return sandbox.PauseMemory
	}
	return sandbox.PauseDisk
}

// memoryRefusal says why runtime rtName cannot take a memory checkpoint
// here ("" = it can): the reason of a pause or fork that falls back to disk.
func memoryRefusal(rtName string, caps runtime.Capabilities) string {
	if caps.Checkpoint {
		return ""
	}
	return "runtime " + rtName + " cannot checkpoint memory here: " + caps.CheckpointReason
}

// forkPlan is how a fork captures its parent.
type forkPlan struct {
	memory      bool   // try a memory checkpoint (fork_mode memory unless it fails)
	exportFirst bool   // export the runtime's in-sandbox rootfs writes while the parent runs
	reason      string // why files only, when !memory
}

// planFork chooses a fork's capture: memory when the runtime can checkpoint,
// and for runsc (which keeps rootfs writes inside the sandbox) the files
// exported before the checkpoint stops the parent. exporter says whether
// the runtime can export them.
func planFork(rtName string, caps runtime.Capabilities, exporter bool) forkPlan {
	if why := memoryRefusal(rtName, caps); why != "" {
		return forkPlan{reason: why}
	}
	return forkPlan{memory: true, exportFirst: exporter && rtName == "runsc"}
}

// nextGeneration is a fork child's generation given its parent's recorded
// one ("" or unreadable: the parent is no fork, generation 0).
func nextGeneration(parent int) int {
	if parent > 0 {
		return parent + 1
	}
	return 1
}

// resumeFrom decides what a resume of a sandbox paused with mode starts
// from, given whether a cold resume was asked for. restore reports whether
// it must try the memory image, thaw whether it must thaw frozen processes;
// otherwise the sandbox boots from its workspace.
func resumeFrom(paused sandbox.PauseMode, cold bool) (thaw, restore bool, why string) {
	switch paused {
	case sandbox.PauseFreeze:
		return true, false, ""
	case sandbox.PauseMemory:
		if cold {
			return false, false, "cold resume requested"
		}
		return false, true, ""
	}
	return false, false, ""
}

func isExporter(rt runtime.Runtime) bool {
	_, ok := rt.(upperExporter)
	return ok
}

// diskPhase names the span of a disk pause's halt: "pause.fallback" when
// a freeze or memory pause fell back to it (why says why), "pause.disk"
// when a disk pause was asked for.
func diskPhase(why string) string {
	if why != "" {
		return "pause.fallback"
	}
	return "pause.disk"
}
