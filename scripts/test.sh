#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up (install, build, templates),
# go vet, every Go test with -race (privileged tests included: CI=true makes
# a missing prerequisite fail rather than skip), then the E2B SDK suite.
# Exits non-zero if any step fails; all steps run so one report shows all.
#
# BERTH_TEST_PKGS narrows the Go packages for local runs (default ./...).
set -euo pipefail

cd "$(dirname "$0")/.."
export CI=${CI:-true}
export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Test artefacts (the console's browser screenshots) are kept here after the run.
export BERTH_ARTIFACTS=${BERTH_ARTIFACTS:-$(pwd)/artifacts}

log() { printf '\033[1m[test %s]\033[0m %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
FAILED=()
step() { # step NAME CMD...: run, time and record a step without stopping
	local name=$1 start=$SECONDS rc=0
	shift
	log "== $name"
	"$@" || rc=$?
	log "== $name: $([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start))s"
	[ "$rc" -eq 0 ] || FAILED+=("$name")
	return 0
}

# Set-up failing means nothing else can be trusted: stop here.
start=$SECONDS
bash scripts/setup.sh --no-serve
log "setup done in $((SECONDS - start))s"

PKGS=${BERTH_TEST_PKGS:-./...}
# Cluster mode's tests run a real kube-apiserver and etcd built from the module
# proxy (cached by version in /var/cache/berth/kube: ~6 min once, then nothing).
export BERTH_KUBE_ASSETS=${BERTH_KUBE_ASSETS:-$(bash scripts/kube-assets.sh)}

step "go vet" go vet $PKGS
# go.mod must be tidy: direct requirements direct, nothing missing or unused.
step "go mod tidy" go mod tidy -diff

# The CLI and the Go client build (and vet) for every OS users run them on;
# only `berth serve` is Linux-only. -tags clientonly is that build on Linux.
crossbuild() {
	local os rc=0
	for os in darwin windows; do
		GOOS=$os GOARCH=amd64 go build -o /dev/null ./cmd/berth || rc=1
		GOOS=$os GOARCH=amd64 go vet ./cmd/berth ./internal/cli ./client ./api/wire || rc=1
	done
	GOOS=darwin GOARCH=arm64 go build -o /dev/null ./cmd/berth || rc=1
	go vet -tags clientonly ./cmd/berth || rc=1
	return $rc
}
step "cross-build (darwin, windows, clientonly)" crossbuild

GOTEST_LOG=$(mktemp -t berth-gotest.XXXXXX)
gotest() {
	go test -race -count=1 -timeout 60m $PKGS 2>&1 | tee "$GOTEST_LOG"
}
step "go test" gotest
step "fuzz" bash scripts/fuzz.sh

if [ -f test/e2b/package.json ]; then
	e2b() {
		(cd test/e2b && npm ci --no-audit --no-fund) || return
		if [ -f test/e2b/run.sh ]; then
			# run.sh starts `berth serve` on a scratch data dir, puts the
			# code-interpreter-v1 template in (built once per recipe, then
			# imported from /var/cache/berth/rootfs: scripts/code-interpreter-template.sh)
			# and runs `npm test` against it.
			bash test/e2b/run.sh
		else
			(cd test/e2b && npm test)
		fi
	}
	step "e2b sdk suite" e2b
else
	log "no test/e2b/package.json: E2B SDK suite not present"
fi

log "== go test summary"
grep -E '^(ok|FAIL|---|panic:|\?)' "$GOTEST_LOG" | grep -vE '^--- (PASS|SKIP)' | grep -v '\[no test files\]' || true
rm -f "$GOTEST_LOG"
[ -d "$BERTH_ARTIFACTS" ] && log "test artefacts kept in $BERTH_ARTIFACTS"
if [ "${#FAILED[@]}" -gt 0 ]; then
	log "FAILED: ${FAILED[*]}"
	exit 1
fi
log "all passed in $((SECONDS))s"
