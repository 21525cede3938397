#!/usr/bin/env bash
# Builds a real Kubernetes API server (kube-apiserver), etcd and kubectl from
# the Go module proxy, for cluster mode's tests (internal/kube/kubetest) and
# the manifests' server-side dry run. No binary is downloaded from anywhere
# but the module proxy the host's `go env GOPROXY` names.
#
# Cached by version outside the checkout: the first run on a new machine takes
# about 6-7 minutes (kube-apiserver is ~5 of them), later runs nothing.
# Prints the directory holding the three binaries (BERTH_KUBE_ASSETS).
#
# Built without -trimpath, like the project's own tests, so a `go test` that
# shares the build cache reuses the compiled packages.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.37.2}          # k8s.io/kubernetes tag
STAGING_VERSION=v0.${K8S_VERSION#v1.}        # v1.37.2 -> v0.37.2 (the published staging modules)
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}         # go.etcd.io/etcd/server/v3 (Kubernetes 1.37 pins etcd 3.7.0)
CACHE=${BERTH_CACHE_DIR:-/var/cache/berth}
ASSETS=${BERTH_KUBE_ASSETS:-$CACHE/kube/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}
if [ -x "$ASSETS/kube-apiserver" ] && [ -x "$ASSETS/etcd" ] && [ -x "$ASSETS/kubectl" ]; then
	echo "$ASSETS"
	exit 0
fi
export PATH="/usr/local/go/bin:$PATH"
GOVER=$(go env GOVERSION)
GOVER=${GOVER#go}
GOVER=$(echo "$GOVER" | cut -d. -f1-2).0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/kas" "$WORK/etcd" "$ASSETS"
export GOFLAGS=-mod=mod

# kube-apiserver and kubectl: a scratch module mapping every staging module
# (k8s.io/kubernetes' go.mod points them at ./staging) to its published version.
cd "$WORK"
GOMOD=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
	printf 'module local/kube-apiserver-build\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$GOVER" "$K8S_VERSION"
	for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$GOMOD"); do
		# unpublished staging modules (sample-controller, ...) are not needed
		if go list -m "$m@$STAGING_VERSION" >/dev/null 2>&1; then printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; fi
	done
	printf ')\n'
} >"$WORK/kas/go.mod"
cd "$WORK/kas"
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\t_ "k8s.io/kubectl/pkg/cmd"\n)\n' >tools.go
go mod tidy >&2
V=k8s.io/component-base/version
MINOR=${K8S_VERSION#v1.}
MINOR=${MINOR%%.*}
LD="-s -w -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean"
go build -ldflags "$LD" -o "$ASSETS/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
go build -ldflags "$LD" -o "$ASSETS/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl >&2

# etcd: a one-file main around etcdmain.
cd "$WORK/etcd"
printf 'module local/etcd-build\n\ngo %s\n' "$GOVER" >go.mod
printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >main.go
go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
go mod tidy >&2
go build -ldflags "-s -w" -o "$ASSETS/etcd.tmp" . >&2
# Renamed last: a run cut short leaves no binary that looks complete.
for b in kube-apiserver kubectl etcd; do mv "$ASSETS/$b.tmp" "$ASSETS/$b"; done
echo "$ASSETS"
