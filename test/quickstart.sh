#!/bin/sh
# The README quickstart as a script, against a running `berth serve` with the
# default template and default runtime: BERTH_URL and BERTH_API_KEY (or the
# admin key on the server host) select it; BERTH names the CLI (default
# `berth` on PATH). Every step checks what the README promises; a memory
# pause is memory where the runtime can checkpoint here and disk otherwise,
# and must say which (`berth info` tells).
# Run by test/e2e's TestQuickstart in CI.
set -eu
B=${BERTH:-berth}
fail() { echo "quickstart: $*" >&2; exit 1; }
tmp=$(mktemp -d)
ID=
cleanup() { [ -z "$ID" ] || $B rm -f "$ID" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT

$B template ls | grep -q '^default  *ready' || fail "template default is not ready: $($B template ls)"
ID=$($B create --ttl 1h --label task=demo)
echo "created $ID"
out=$($B exec "$ID" -- python3 -c 'print(6*7)') && [ "$out" = 42 ] || fail "python3 printed '$out'"
out=$(echo 'print("hi")' | $B exec -i "$ID" -- python3) && [ "$out" = hi ] || fail "stdin: '$out'"
code=0; $B exec "$ID" -- sh -c 'exit 7' || code=$?
[ "$code" = 7 ] || fail "exit code $code, want the command's 7"
printf 'a,b\n1,2\n' >"$tmp/data.csv"
$B cp "$tmp/data.csv" "$ID:/home/user/data.csv"
$B cp "$ID:/home/user/data.csv" "$tmp/back.csv"
cmp -s "$tmp/data.csv" "$tmp/back.csv" || fail "cp round trip differs"
# A process that lives in memory only: its pid survives a memory pause.
$B exec "$ID" -- sh -c 'setsid sleep 100000 </dev/null >/dev/null 2>&1 &'
pid=$($B exec "$ID" -- sh -c 'pgrep -x sleep || pidof sleep')
[ -n "$pid" ] || fail "the background sleep is not running"

$B pause "$ID" --mode memory
state=$($B inspect "$ID" | tr -d ' \n')
echo "$state" | grep -q '"state":"paused"' || fail "after pause: $state"
echo "$state" | grep -q '"pause_mode_requested":"memory"' || fail "after pause: $state"
$B resume "$ID"
state=$($B inspect "$ID" | tr -d ' \n')
echo "$state" | grep -q '"state":"running"' || fail "after resume: $state"
after=$($B exec "$ID" -- sh -c 'pgrep -x sleep || pidof sleep || true')
if echo "$state" | grep -q '"pause_mode":"memory"'; then
	[ "$after" = "$pid" ] || fail "memory pause: sleep pid '$after' after resume, was '$pid'"
	echo "paused in memory: processes continued"
else
	echo "$state" | grep -q '"pause_mode":"disk"' || fail "pause mode neither memory nor disk: $state"
	$B events "$ID" | grep -q pause_degraded || fail "a disk fallback without a pause_degraded event"
	echo "paused to disk (recorded): $($B info | tail -n +2 | tr '\n' ' ')"
fi
$B exec "$ID" -- cat /home/user/data.csv | cmp -s - "$tmp/data.csv" || fail "file lost across pause/resume"
$B ls | grep -q "$ID" || fail "ls does not list $ID"
$B ls --json | grep -q "\"$ID\"" || fail "ls --json does not list $ID"
$B events "$ID" | grep -q resumed || fail "no resumed event"
$B rm "$ID"
ID=
echo "quickstart ok"
