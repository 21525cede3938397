# shellcheck shell=sh
# Where the set-up fetches from, taken from the host's own configuration so
# that a host behind a mirror or a proxy works and the project names no
# mirror. Sourced by scripts/setup.sh and scripts/build-criu.sh; the same
# rules as internal/template/mirror.go (mirror_test.go runs both on one
# table of sources files).
#
#   debian_mirror [SUITE]  the Debian archive URL: $BERTH_DEBIAN_MIRROR, else
#                          the host's apt sources (BERTH_APT_DIR, default
#                          /etc/apt): the first http(s) "deb" entry for SUITE,
#                          else for any Debian suite; -security, -updates,
#                          -backports suites are skipped.
#   go_proxy               the Go module proxy URL: the first URL entry of
#                          $BERTH_GOPROXY, else of `go env GOPROXY` ($GOPROXY
#                          when go is missing); direct and off are skipped.
# Both print nothing and fail, naming the variable to set, when nothing is found.

# _apt_entries prints "URI SUITE" for every deb entry, in apt's order.
_apt_entries() {
	_dir=${BERTH_APT_DIR:-/etc/apt}
	for _f in "$_dir/sources.list" "$_dir"/sources.list.d/*; do
		[ -f "$_f" ] || continue
		case "$_f" in
		*/sources.list | *.list)
			awk '{ sub(/#.*/, "") }
			$1 == "deb" {
				i = 2
				if ($2 ~ /^\[/) { # options, possibly with spaces: [ arch=amd64 signed-by=/k.gpg ]
					while (i <= NF && $i !~ /\]$/) i++
					i++
				}
				if (i + 1 <= NF) print $i, $(i + 1)
			}' "$_f"
			;;
		*.sources)
			awk 'function flush(  nu, ns, u, s, a, b, t, nt, isdeb) {
				nt = split(f["types"], t, /[ \t]+/); isdeb = 0
				for (a = 1; a <= nt; a++) if (t[a] == "deb") isdeb = 1
				if (isdeb && tolower(f["enabled"]) != "no") {
					nu = split(f["uris"], u, /[ \t]+/); ns = split(f["suites"], s, /[ \t]+/)
					for (a = 1; a <= nu; a++) for (b = 1; b <= ns; b++) if (u[a] != "" && s[b] != "") print u[a], s[b]
				}
				delete f; last = ""
			}
			/^#/ { next }
			/^[ \t]*$/ { flush(); next }
			/^[ \t]/ { if (last != "") { v = $0; sub(/^[ \t]+/, "", v); f[last] = f[last] " " v }; next }
			{
				if (index($0, ":") == 0) { last = ""; next }
				k = tolower(substr($0, 1, index($0, ":") - 1)); gsub(/[ \t]/, "", k)
				v = substr($0, index($0, ":") + 1); sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v)
				f[k] = v; last = k
			}
			END { flush() }' "$_f"
			;;
		esac
	done
}

debian_mirror() {
	if [ -n "${BERTH_DEBIAN_MIRROR:-}" ]; then
		case "$BERTH_DEBIAN_MIRROR" in
		http://* | https://*) printf '%s\n' "${BERTH_DEBIAN_MIRROR%/}" && return 0 ;;
		*) echo "BERTH_DEBIAN_MIRROR must be an http(s) URL of a Debian archive, got '$BERTH_DEBIAN_MIRROR'" >&2 && return 1 ;;
		esac
	fi
	_m=$(_apt_entries | awk -v want="${1:-}" '
		$1 !~ /^https?:\/\// { next }
		$2 ~ /[-\/]/ { next } # bookworm-security, bookworm-updates, buster/updates, ...
		{ uri = $1; sub(/\/+$/, "", uri) }
		$2 == want { print uri; found = 1; exit }
		fallback == "" && $2 ~ /^(oldoldstable|oldstable|stable|testing|unstable|sid|experimental|buster|bullseye|bookworm|trixie|forky|duke)$/ { fallback = uri }
		END { if (!found && fallback != "") print fallback }')
	if [ -z "$_m" ]; then
		echo "no Debian mirror in the host's apt sources (${BERTH_APT_DIR:-/etc/apt}/sources.list, sources.list.d/*.list, *.sources); set BERTH_DEBIAN_MIRROR to the URL of a Debian archive" >&2
		return 1
	fi
	printf '%s\n' "$_m"
}

go_proxy() {
	if [ -n "${BERTH_GOPROXY:-}" ]; then
		_p=$BERTH_GOPROXY _src=BERTH_GOPROXY
	elif command -v go >/dev/null 2>&1; then
		_p=$(go env GOPROXY) _src="go env GOPROXY"
	else
		_p=${GOPROXY:-} _src=GOPROXY
	fi
	_u=$(printf '%s\n' "$_p" | tr ',|' '\n\n' | awk '/^https?:\/\// { sub(/\/+$/, ""); print; exit }')
	if [ -z "$_u" ]; then
		echo "no Go module proxy URL in $_src ('$_p'); set BERTH_GOPROXY to the URL of a Go module proxy" >&2
		return 1
	fi
	printf '%s\n' "$_u"
}
