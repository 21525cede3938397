#!/usr/bin/env bash
# Puts a template defined in the repo (a Dockerfile directory under
# templates/) into a running berth server, building it at most once per
# recipe: the built rootfs is cached outside the checkout as
# $BERTH_CACHE_DIR/rootfs/<dir name>-<recipe hash>.tar (+ .json, its start
# command and environment), where the recipe hash covers every file of the
# template's directory and the layers of the server's default template it is
# built FROM. test/e2b/run.sh runs it (so scripts/test.sh does too) for
# code-interpreter-v1 (templates/code-interpreter) and desktop
# (templates/desktop).
#
#   scripts/template-cache.sh NAME CONTEXT_DIR BERTH_BIN DATA_DIR
#
# BERTH_URL and BERTH_API_KEY name the server; DATA_DIR is its data dir (read
# on a cache miss to pack the built layers: as root, on the server's host).
#   miss: `berth template build` of the Dockerfile (Debian packages through
#         the sandbox's egress, minutes), then its layers, squashed by a
#         read-only overlay mount, are packed into the cache tar.
#   hit:  `berth template import` of the tar (a few seconds) and a
#         Dockerfile of FROM + ENV/WORKDIR/USER/CMD from the .json.
set -euo pipefail

usage="usage: $0 NAME CONTEXT_DIR BERTH_BIN DATA_DIR"
NAME=${1:?$usage}
CTX="$(cd "${2:?$usage}" && pwd)"
BERTH=${3:?$usage}
DATA=${4:?$usage}
: "${BERTH_URL:?set BERTH_URL}" "${BERTH_API_KEY:?set BERTH_API_KEY}"
PREFIX=$(basename "$CTX")
CACHE=${BERTH_CACHE_DIR:-/var/cache/berth}/rootfs
mkdir -p "$CACHE"

log() { printf '[%s %s] %s\n' "$NAME" "$(date +%H:%M:%S)" "$*" >&2; }

tpl_json() { curl -fsS -H "X-API-Key: $BERTH_API_KEY" "$BERTH_URL/v1/templates/$1"; }

base_layers=$(tpl_json default | python3 -c 'import json,sys; print(",".join(json.load(sys.stdin)["layers"]))')
[ -n "$base_layers" ] || { log "the default template has no layers"; exit 1; }
hash=$( (
	cd "$CTX"
	find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
	echo "FROM default layers $base_layers"
) | sha256sum | cut -c1-16)
tar="$CACHE/$PREFIX-$hash.tar"
meta="$CACHE/$PREFIX-$hash.json"

exec 9>"$tar.lock"
flock 9 # one build per recipe at a time

if [ ! -s "$tar" ] || [ ! -s "$meta" ]; then
	log "cache miss ($tar): building $NAME from $CTX"
	start=$SECONDS
	"$BERTH" template build -t "$NAME" "$CTX" | awk '/^\[|ready|error/ { print "  " $0; fflush() }' >&2
	log "built in $((SECONDS - start))s; packing its layers"
	tpl_json "$NAME" >"$meta.tmp"
	lowers=$(python3 -c 'import json,sys; print(":".join(sys.argv[1] + "/layers/" + d for d in json.load(open(sys.argv[2]))["layers"]))' "$DATA" "$meta.tmp")
	mnt=$(mktemp -d /tmp/berth-ci-squash-XXXXXX)
	trap 'umount "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true' EXIT
	# Read-only overlay of the layers alone: whiteouts resolved, nothing written;
	# nosuid,nodev,noexec like every other mount of sandbox-written content.
	mount -t overlay overlay -o "ro,nosuid,nodev,noexec,lowerdir=$lowers" "$mnt"
	tar --numeric-owner --xattrs --xattrs-include='security.capability' -C "$mnt" -cf "$tar.tmp" .
	umount "$mnt"
	mv "$meta.tmp" "$meta"
	mv "$tar.tmp" "$tar"
	log "cached $tar ($(du -h "$tar" | cut -f1))"
	exit 0
fi

log "cache hit: importing $tar"
start=$SECONDS
"$BERTH" template import "$NAME-rootfs" "$tar" >/dev/null
ctx=$(mktemp -d /tmp/berth-ci-ctx-XXXXXX)
trap 'rm -rf "$ctx"' EXIT
python3 - "$meta" "$NAME-rootfs" >"$ctx/Dockerfile" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
print("FROM " + sys.argv[2])
for k, v in sorted((t.get("env") or {}).items()):
    print("ENV %s=%s" % (k, json.dumps(v)))
if t.get("workdir"):
    print("WORKDIR " + t["workdir"])
if t.get("user"):
    print("USER " + t["user"])
if t.get("start_cmd"):
    print("CMD " + json.dumps(t["start_cmd"]))
EOF
"$BERTH" template build -t "$NAME" "$ctx" >/dev/null
log "$NAME ready from the cache in $((SECONDS - start))s"
