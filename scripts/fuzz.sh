#!/usr/bin/env bash
# Runs every Go fuzz target for a bounded time each (FUZZTIME, default 10s),
# one after the other. Targets fuzz what a tenant controls: REST and E2B
# request bodies, agent answers and events, Dockerfiles, tar imports, DNS
# packets, the egress proxy's HTTP relay, and the fork/merge engines: line
# diffs and three-way line merges of sandbox-written text
# (internal/fsdiff/linediff FuzzHunks, internal/merge FuzzLines) and upper
# tars a runsc sandbox exports (internal/fsdiff FuzzTarLayer). A crasher
# is written to the package's testdata/fuzz/ and fails the run; commit it
# with the fix, it then runs as a regression test in every `go test`.
# Minimizing a new interesting input is capped too (FUZZMINIMIZE), so a
# target with large seeds cannot run far past its FUZZTIME.
#
#   FUZZTIME=1m bash scripts/fuzz.sh            # longer
#   bash scripts/fuzz.sh ./internal/egress      # one package
set -euo pipefail

cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
FUZZTIME=${FUZZTIME:-10s}
FUZZMINIMIZE=${FUZZMINIMIZE:-5s}

# coordinator_race LOG: the run failed only with the bare error Go's fuzz
# coordinator returns when its -fuzztime context ends under a busy worker:
# no panic, no failing input, no hung worker, no t.Fatal output.
coordinator_race() {
	grep -qxE '[[:space:]]+context deadline exceeded' "$1" &&
		! grep -qE 'panic:|Failing input written|fuzzing process hung|_test\.go:[0-9]+:' "$1"
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=()
for pkg in $(go list -f '{{.Dir}}' "${@:-./...}"); do
	# Fuzz targets are top-level `func FuzzX(f *testing.F)` in _test.go files.
	targets=$(grep -hoE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' "$pkg"/*_test.go 2>/dev/null |
		sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' | sort -u) || true
	rel=./${pkg#"$PWD"/}
	for t in $targets; do
		printf '[fuzz] %s %s (%s)\n' "$rel" "$t" "$FUZZTIME" >&2
		corpus=$pkg/testdata/fuzz/$t
		before=$(ls "$corpus" 2>/dev/null || true)
		if go test -run '^$' -fuzz "^${t}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZE" "$rel" 2>&1 | tee "$out"; then
			continue
		fi
		after=$(ls "$corpus" 2>/dev/null || true)
		if [ "$before" = "$after" ] && coordinator_race "$out"; then
			# Go 1.26's fuzz coordinator can report its own -fuzztime
			# deadline as a failure (go.dev/issue/75804, fixed in 1.27):
			# no input was written and none failed. Replaying the seeds
			# and corpus tells that apart from a finding.
			echo "[fuzz] $rel $t: the coordinator's deadline race (go.dev/issue/75804), no failing input; replaying the corpus" >&2
			if go test -run "^${t}\$" "$rel"; then
				continue
			fi
		fi
		failed+=("$rel:$t")
	done
done
if [ "${#failed[@]}" -gt 0 ]; then
	echo "[fuzz] FAILED: ${failed[*]}" >&2
	exit 1
fi
echo "[fuzz] all targets passed" >&2
