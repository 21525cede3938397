package node

import (
	"bufio"
	"bytes"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/kube/berthv1"
)

// Capacity measures what this host can give sandboxes: CPUs this process
// may run on (its affinity, narrowed by a cgroup CPU limit), memory (the
// machine's, or the cgroup limit when lower), and the size of the data
// dir's filesystem.
func Capacity(dataDir string) berthv1.Resources {
	cpu := int64(goruntime.NumCPU()) * 1000
	if q := cgroupCPUMillis(); q > 0 && q < cpu {
		cpu = q
	}
	mem := memTotalMiB()
	if l := cgroupMemMiB(); l > 0 && (mem == 0 || l < mem) {
		mem = l
	}
	var disk int64
	var fs unix.Statfs_t
	if unix.Statfs(dataDir, &fs) == nil {
		disk = int64(fs.Blocks) * int64(fs.Bsize) >> 20
	}
	return berthv1.Resources{CPUMillis: cpu, MemoryMiB: mem, DiskMiB: disk}
}

func memTotalMiB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb >> 10
		}
	}
	return 0
}

// ownCgroup is this process's cgroup v2 directory ("" on v1 or unknown).
func ownCgroup() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if p, ok := bytes.CutPrefix(l, []byte("0::")); ok {
			return "/sys/fs/cgroup" + string(p)
		}
	}
	return ""
}

func cgroupMemMiB() int64 {
	cg := ownCgroup()
	if cg == "" {
		return 0
	}
	b, err := os.ReadFile(cg + "/memory.max")
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil { // "max"
		return 0
	}
	return v >> 20
}

func cgroupCPUMillis() int64 {
	cg := ownCgroup()
	if cg == "" {
		return 0
	}
	b, err := os.ReadFile(cg + "/cpu.max")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	quota, err1 := strconv.ParseInt(f[0], 10, 64)
	period, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || period <= 0 {
		return 0
	}
	return quota * 1000 / period
}
