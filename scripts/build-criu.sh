#!/bin/sh
# Builds CRIU 4.1.1 from Debian's upstream tarball into /var/cache/berth/bin/criu.
# Debian bookworm's criu 3.17 fails on 6.x kernels ("vdso: Unexpected rt vDSO area
# bounds"), so runc memory checkpoints need a newer CRIU. See shared/notes/checkpoint.md.
# Idempotent: exits at once when the binary exists and `criu check` passes.
# The tarball comes from the host's Debian mirror (its apt sources, or
# BERTH_DEBIAN_MIRROR; see scripts/hostcfg.sh).
#
#   scripts/build-criu.sh [--print-url]   --print-url: print the tarball URL and exit
set -eu

VERSION=4.1.1
DEST=${CRIU_DEST:-/var/cache/berth/bin/criu}
WORK=${CRIU_WORK:-/var/cache/berth/src}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/hostcfg.sh"

# criu_url prints where the orig tarball is: the pool is shared by every
# suite of a mirror, so any Debian entry of the host's sources will do.
criu_url() {
	mirror=$(debian_mirror) || return 1
	printf '%s/pool/main/c/criu/criu_%s.orig.tar.xz\n' "$mirror" "$VERSION"
}

if [ "${1:-}" = "--print-url" ]; then
	criu_url
	exit
fi

# Local patches, applied in order; their hash is stamped next to the binary
# so a changed patch set rebuilds.
# - criu-rlimit-eperm.patch: read rlimits from /proc/<pid>/limits where
#   prlimit64 gets EPERM (hosts that withhold CAP_SYS_RESOURCE).
# - criu-no-hw-breakpoints.patch: step to rt_sigreturn syscall by syscall
#   instead of trusting an x86 debug-register breakpoint. On a 6.18.44 VM
#   host `criu dump` hung right after "Daemon N exited trapping" -- the
#   wait for that breakpoint's trap -- while `criu check` said "Looks good":
#   consistent with a breakpoint that is set but never fires. The stepping
#   path is CRIU's own (CRIU_FAULT=130) and costs a few ptrace stops per
#   task. berth serve's trial checkpoint catches any remaining hang.
# - criu-userns-check-fds.patch: the dump's check that every namespace
#   belongs to the target user namespace opens them before entering it.
#   From inside, opening /proc/<pid>/ns/* is refused for a non-dumpable
#   task whose mm belongs to the host's user namespace, which is what a
#   task CRIU restored is (its mm comes from CRIU's fork): without the
#   patch a user-namespaced runc sandbox (berth-agent, PID 1, is not
#   dumpable) checkpoints once and never again after its restore.
# - criu-sockopt-eopnotsupp.patch: on recent kernels (seen on 6.18)
#   getsockopt(SO_PASSCRED / SO_PASSSEC) on a TCP or UDP socket fails with
#   EOPNOTSUPP, which made every dump of a process holding one fail (any
#   sandbox running a server: its memory pause fell back to disk). Such a
#   socket cannot have the option set, so the dump records it as off.
PATCHES="$HERE/criu-rlimit-eperm.patch $HERE/criu-no-hw-breakpoints.patch $HERE/criu-userns-check-fds.patch $HERE/criu-sockopt-eopnotsupp.patch"
STAMP=$(cat $PATCHES | sha256sum | cut -c1-16)

if [ -x "$DEST" ] && [ "$(cat "$DEST.stamp" 2>/dev/null)" = "$STAMP" ] && "$DEST" check >/dev/null 2>&1; then
	echo "criu: $DEST already built and 'criu check' passes"
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends \
	gcc make pkgconf patch xz-utils curl ca-certificates \
	libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev \
	libnl-3-dev libnet1-dev libcap-dev libbsd-dev libnftables-dev \
	uuid-dev libgnutls28-dev python3 >/dev/null

mkdir -p "$WORK" "$(dirname "$DEST")"
cd "$WORK"
if [ ! -f "criu_${VERSION}.orig.tar.xz" ]; then
	URL=$(criu_url)
	echo "criu: fetching $URL"
	curl -fsSL -o "criu_${VERSION}.orig.tar.xz.part" "$URL"
	mv "criu_${VERSION}.orig.tar.xz.part" "criu_${VERSION}.orig.tar.xz"
fi
rm -rf "criu-${VERSION}"
tar -xJf "criu_${VERSION}.orig.tar.xz"
cd "criu-${VERSION}"
for p in $PATCHES; do
	patch -p1 --quiet <"$p"
done
# Without the nftables default the network lock calls ip6tables-restore,
# which is not installed, and every dump fails.
make -j2 criu NETWORK_LOCK_DEFAULT=NETWORK_LOCK_NFTABLES >build.log 2>&1 || {
	tail -n 40 build.log >&2
	exit 1
}
install -m 0755 criu/criu "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
echo "$STAMP" >"$DEST.stamp"
"$DEST" check
