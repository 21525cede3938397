package testutil

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// HostLeaks lists what of the host still lives under dir: each mount whose
// mount point is dir or below it (from /proc/self/mountinfo, so the mount
// namespace of the test), and each loop device whose backing file is
// below it (from sysfs: a loop device outlives its unlinked file, which
// the kernel then shows with a " (deleted)" suffix).
func HostLeaks(dir string) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	var out []string
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(mi))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superopts
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if !under(mp, dir) {
			continue
		}
		what := "mount " + mp
		for i, x := range f {
			if x == "-" && i+2 < len(f) {
				what += " (" + f[i+1] + " from " + unescapeMountinfo(f[i+2]) + ")"
				break
			}
		}
		out = append(out, what)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range loops {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if under(file, dir) {
			dev := filepath.Base(filepath.Dir(filepath.Dir(p)))
			out = append(out, fmt.Sprintf("loop device /dev/%s backed by %s", dev, strings.TrimSpace(string(b))))
		}
	}
	return out, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 is a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
