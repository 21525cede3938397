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
	// renamed: the files are only ever replaced whole by a rename (the
	// daemon's env.json, channels.writeFile), never rewritten in place, so
	// every new content is a new inode while the old one still exists: a
	// version is trusted even inside the racy window. A fresh sandbox's
	// execs would otherwise re-read env.json for its first second.
	renamed bool

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
		cacheable = cacheable && (!v.exists || c.renamed || v.settled(now))
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

// maxSmallFile bounds readSmallFile.
const maxSmallFile = 16 << 20

// readSmallFile reads a small file whole with plain syscalls: os.ReadFile
// registers the fd with Go's poller first (fcntl, epoll_ctl: four more
// Sentry trips under gVisor, on every exec that re-reads passwd or env).
func readSmallFile(path string) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= maxSmallFile {
				return nil, &fs.PathError{Op: "read", Path: path, Err: errors.New("file too large")}
			}
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}
