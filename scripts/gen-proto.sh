#!/usr/bin/env bash
# Regenerates api/gen/ from api/proto/*.proto (Go messages + connect-go handlers).
# Needs protoc (apt-get install -y protobuf-compiler) and the plugins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH)/bin:$PATH"
module=github.com/berth-dev/berth
rm -rf api/gen/process api/gen/filesystem
protoc -I api/proto \
  --go_out=api/gen --go_opt=module="$module/api/gen" \
  --connect-go_out=api/gen --connect-go_opt=module="$module/api/gen" \
  api/proto/process.proto api/proto/filesystem.proto
gofmt -l api/gen || true
