package agent

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"
)

// fileVersion identifies one content of a file by what stat reports. Under
// gVisor every open+read+close of a small file goes to the gofer (~0.2 ms
// per file on the exec path) while a stat is answered from its cache, so an
// exec re-reads /etc/passwd, /etc/group and env.json only when one changed.
type fileVersion struct {
	exists           bool
	dev, ino         uint64
	size             int64
	mtimeNs, ctimeNs int64
}

// racyWindow: a file modified less than this before it was read is never
// trusted from the cache. File times come from a coarse clock, so a second
// same-size write in the same tick would keep the version (git's "racy
// index" problem); a file that old cannot be rewritten inside its own tick.
const racyWindow = time.Second

func statVersion(path string) (fileVersion, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileVersion{}, nil
	}
	if err != nil {
		return fileVersion{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileVersion{}, errors.New("no stat_t")
	}
	return fileVersion{exists: true, dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}, nil
}

// settled reports whether v is old enough to be cached at now.
func (v fileVersion) settled(now time.Time) bool {
	last := max(v.mtimeNs, v.ctimeNs)
	return now.UnixNano()-last >= int64(racyWindow)
}

// versionedCache holds one value derived from a set of files, valid while
// none of them changed. The value must not be modified by its users.
type versionedCache[T any] struct {
	mu   sync.Mutex
	vers []fileVersion
	val  T
	ok   bool
}

// get (at now) returns the cached value if every path still has the version it had
// when the value was loaded; otherwise it calls load and caches its result
// when every file is settled. A stat error bypasses the cache.
func (c *versionedCache[T]) get(now time.Time, paths []string, load func() (T, error)) (T, error) {
	vers := make([]fileVersion, len(paths))
	cacheable := true
	for i, p := range paths {
		v, err := statVersion(p)
		if err != nil {
			cacheable = false
			break
		}
		vers[i] = v
		cacheable = cacheable && (!v.exists || v.settled(now))
	}
	c.mu.Lock()
	if cacheable && c.ok && equalVersions(c.vers, vers) {
		val := c.val
		c.mu.Unlock()
		return val, nil
	}
	c.mu.Unlock()
	val, err := load()
	if err != nil || !cacheable {
		return val, err
	}
	c.mu.Lock()
	c.vers, c.val, c.ok = vers, val, true
	c.mu.Unlock()
	return val, nil
}

func equalVersions(a, b []fileVersion) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
