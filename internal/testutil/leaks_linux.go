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
// mount point is dir or below it (MountsUnder), and each loop device whose
// backing file is below it (from sysfs: a loop device outlives its
// unlinked file, which the kernel then shows with a " (deleted)" suffix).
func HostLeaks(dir string) ([]string, error) {
	dir = resolved(dir)
	ms, err := mountsUnder(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		out = append(out, "mount "+m.point+" ("+m.fstype+" from "+m.source+")")
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

// MountsUnder lists the mount points at or below dir in this mount
// namespace, parents before children (mountinfo's order).
func MountsUnder(dir string) ([]string, error) {
	ms, err := mountsUnder(resolved(dir))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.point
	}
	return out, nil
}

type mount struct{ point, fstype, source string }

func resolved(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		dir = a
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	return dir
}

func mountsUnder(dir string) ([]mount, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(mi))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		m := mount{point: unescapeMountinfo(f[4])}
		if !under(m.point, dir) {
			continue
		}
		for i, x := range f {
			if x == "-" && i+2 < len(f) {
				m.fstype, m.source = f[i+1], unescapeMountinfo(f[i+2])
				break
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
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
