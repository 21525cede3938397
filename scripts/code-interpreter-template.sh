#!/usr/bin/env bash
# Puts the code-interpreter-v1 template (templates/code-interpreter) into a
# running berth server, built once per recipe and then imported from the host
# cache: see scripts/template-cache.sh.
#
#   scripts/code-interpreter-template.sh BERTH_BIN DATA_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec bash "$here/template-cache.sh" code-interpreter-v1 "$here/../templates/code-interpreter" "$@"
