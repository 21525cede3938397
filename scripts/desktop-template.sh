#!/usr/bin/env bash
# Puts the desktop template (templates/desktop, for @e2b/desktop) into a
# running berth server, built once per recipe and then imported from the host
# cache: see scripts/template-cache.sh.
#
#   scripts/desktop-template.sh BERTH_BIN DATA_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec bash "$here/template-cache.sh" desktop "$here/../templates/desktop" "$@"
