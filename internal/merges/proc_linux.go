package merges

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Bounds of the open-file scan: the target's processes are hostile and
// may open as many files as their limits allow.
const (
	maxProcs     = 4096
	maxFDs       = 4096
	maxOpenFiles = 256
)

// openFiles lists the target's processes (the host pids in the pid
// namespace of its init, pid) that have one of touched (paths relative to
// the sandbox root) open. It only reads /proc links (readlink), never
// opens what they point at.
func openFiles(pid int, touched []string) []OpenFile {
	if pid <= 0 || len(touched) == 0 {
		return nil
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if err != nil {
		return nil
	}
	want := make(map[string]bool, len(touched))
	for _, p := range touched {
		want["/"+p] = true
	}
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []OpenFile
	procs := 0
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil || p <= 0 {
			continue
		}
		base := "/proc/" + n
		if l, err := os.Readlink(base + "/ns/pid"); err != nil || l != ns {
			continue
		}
		if procs++; procs > maxProcs {
			break
		}
		fds, err := os.Open(base + "/fd")
		if err != nil {
			continue
		}
		list, _ := fds.Readdirnames(maxFDs)
		fds.Close()
		for _, fd := range list {
			l, err := os.Readlink(base + "/fd/" + fd)
			if err != nil || !want[l] {
				continue
			}
			out = append(out, OpenFile{PID: p, Cmd: comm(base), Path: strings.TrimPrefix(l, "/")})
			if len(out) >= maxOpenFiles {
				return sortOpen(out)
			}
		}
	}
	return sortOpen(out)
}

func sortOpen(out []OpenFile) []OpenFile {
	sort.Slice(out, func(i, j int) bool {
		if out[i].PID != out[j].PID {
			return out[i].PID < out[j].PID
		}
		return out[i].Path < out[j].Path
	})
	return out
}

// comm is a process's name, at most 64 bytes of it.
func comm(base string) string {
	f, err := os.Open(base + "/comm")
	if err != nil {
		return ""
	}
	defer f.Close()
	line, _ := bufio.NewReaderSize(f, 64).ReadSlice('\n')
	if len(line) > 64 {
		line = line[:64]
	}
	return strings.TrimSpace(string(line))
}

// isMountPoint says whether dir is a mount point (its device differs
// from its parent's, or it is an overlay).
func isMountPoint(dir string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &pst); err != nil {
		return false, err
	}
	return st.Dev != pst.Dev, nil
}
