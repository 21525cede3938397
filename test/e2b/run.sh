#!/usr/bin/env bash
# Runs the E2B SDK suite against a real berth server: builds berth and
# berth-agent, starts `berth serve` on a temporary data dir and a free port,
# reads the admin key, puts the code-interpreter-v1 and desktop templates in
# (built once, then from the host cache), runs `npm test`, and stops the server.
#   test/e2b/run.sh [node --test args and test files; default: all of tests/]
# Needs root (berth serve runs sandboxes) and node >= 20. Sandbox host names
# (hostnames.test.js): the server also serves https://<port>-<id>.berth.localhost
# on 127.0.0.1:443 (BERTH_E2B_TLS_LISTEN overrides; SDKs build these URLs
# without a port), which resolve to loopback through libnss-myhostname
# (scripts/setup.sh); node trusts berth's CA through NODE_EXTRA_CA_CERTS.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$(mktemp -d /tmp/berth-e2b-XXXXXX)"
data="$work/data"
mkdir -p "$data" "$work/bin"
# mktemp makes $work 0700; runc sandboxes in a user namespace reach their
# root filesystem below the data dir as an unprivileged host uid.
chmod 711 "$work"

(cd "$root" && CGO_ENABLED=0 go build -o "$work/bin/berth-agent" ./cmd/berth-agent && go build -o "$work/bin/berth" ./cmd/berth)

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
domain=berth.localhost
tls_listen="${BERTH_E2B_TLS_LISTEN:-127.0.0.1:443}"
getent hosts "49983-check.$domain" >/dev/null || { echo "*.localhost does not resolve (install libnss-myhostname: scripts/setup.sh)"; exit 1; }
"$work/bin/berth" serve --data-dir "$data" --listen "127.0.0.1:$port" \
  --sandbox-domain "$domain" --sandbox-tls-listen "$tls_listen" >"$work/serve.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # Sandboxes outlive the daemon by design: remove any the suite left, and
  # every mount under the work dir, before deleting it.
  for rt in runc runsc; do
    bin="$rt"; [ "$rt" = runsc ] && [ -x /var/cache/berth/bin/runsc ] && bin=/var/cache/berth/bin/runsc
    [ -d "$data/runtime/$rt" ] || continue
    for c in $("$bin" --root "$data/runtime/$rt" list -q 2>/dev/null); do
      "$bin" --root "$data/runtime/$rt" delete --force "$c" >/dev/null 2>&1 || true
    done
  done
  awk -v w="$work/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  if [ "${KEEP:-}" = "" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT

for _ in $(seq 1 600); do
  if [ -s "$data/admin.key" ] && curl -sS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then echo "berth serve exited:"; cat "$work/serve.log"; exit 1; fi
  sleep 0.5
done
[ -s "$data/admin.key" ] || { echo "no admin.key after 300 s"; cat "$work/serve.log"; exit 1; }

# The default template is built (first run) or imported from the cache on start.
key="$(cat "$data/admin.key")"
for _ in $(seq 1 1200); do
  state="$(curl -sS -H "X-API-Key: $key" "http://127.0.0.1:$port/v1/templates/default" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("state",""))' 2>/dev/null || true)"
  [ "$state" = ready ] && break
  [ "$state" = failed ] && { echo "default template failed:"; cat "$work/serve.log"; exit 1; }
  sleep 0.5
done
[ "$state" = ready ] || { echo "default template not ready after 600 s"; cat "$work/serve.log"; exit 1; }

# @e2b/code-interpreter's template: built once per recipe, then imported
# from the host cache (scripts/code-interpreter-template.sh).
BERTH_URL="http://127.0.0.1:$port" BERTH_API_KEY="$key" \
  bash "$root/scripts/code-interpreter-template.sh" "$work/bin/berth" "$data" ||
  { echo "code-interpreter-v1 template failed:"; tail -n 50 "$work/serve.log"; exit 1; }
# @e2b/desktop's template, the same way (scripts/desktop-template.sh).
BERTH_URL="http://127.0.0.1:$port" BERTH_API_KEY="$key" \
  bash "$root/scripts/desktop-template.sh" "$work/bin/berth" "$data" ||
  { echo "desktop template failed:"; tail -n 50 "$work/serve.log"; exit 1; }

cd "$here"
# node_modules as the lockfile says: (re)installed when package-lock.json changed.
lock_sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.berth-lock-sha256 2>/dev/null)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund
  echo "$lock_sum" >node_modules/.berth-lock-sha256
fi
status=0
"$work/bin/berth" ca --data-dir "$data" >"$work/sandbox-ca.pem"
export BERTH_URL="http://127.0.0.1:$port" BERTH_API_KEY="$(cat "$data/admin.key")" BERTH_SANDBOX_DOMAIN="$domain" \
  NODE_EXTRA_CA_CERTS="$work/sandbox-ca.pem" BERTH_SANDBOX_TLS_PORT="${tls_listen##*:}"
if [ "$#" -gt 0 ]; then
  # Files and flags given (e.g. tests/hostnames.test.js): only those.
  node --test --test-concurrency=1 --test-timeout=600000 "$@" || status=$?
else
  npm test || status=$?
fi
if [ "$status" -ne 0 ]; then echo "--- berth serve log (tail) ---"; tail -n 200 "$work/serve.log"; fi
exit "$status"
