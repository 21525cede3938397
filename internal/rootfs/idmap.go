package rootfs

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// IDMap shifts the ids of a sandbox that runs in a user namespace: uids and
// gids 0..Size-1 inside are HostID..HostID+Size-1 on the host. Template and
// snapshot layers stay unshifted on disk (owned as seen inside, so any
// sandbox can use them); they are mounted idmapped under the overlay, and
// the workspace upper holds the shifted host ids, as the kernel writes them.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// String is "HostID:Size", the form ParseIDMap reads.
func (m IDMap) String() string { return fmt.Sprintf("%d:%d", m.HostID, m.Size) }

// ParseIDMap reads "HostID:Size".
func ParseIDMap(s string) (IDMap, error) {
	h, sz, ok := strings.Cut(s, ":")
	host, err1 := strconv.ParseUint(h, 10, 32)
	size, err2 := strconv.ParseUint(sz, 10, 32)
	if !ok || err1 != nil || err2 != nil || host == 0 || size == 0 || host+size > 1<<32-1 {
		return IDMap{}, errs.Field("userns", "%q is not a host id range HOST:SIZE", s)
	}
	return IDMap{HostID: uint32(host), Size: uint32(size)}, nil
}

// Unshift turns a host id written through the mapping back into the id seen
// inside. An id outside the range was written by the host itself (the daemon
// as root, e.g. a CA bundle): below Size it is kept (0 stays root), above it
// becomes the overflow id nobody, which is how the sandbox saw it.
func (m *IDMap) Unshift(id uint32) uint32 {
	if m == nil {
		return id
	}
	if id >= m.HostID && uint64(id) < uint64(m.HostID)+uint64(m.Size) {
		return id - m.HostID
	}
	if id < m.Size {
		return id
	}
	return overflowID
}

// overflowID is the kernel's default overflowuid/overflowgid.
const overflowID = 65534
