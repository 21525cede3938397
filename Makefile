# Convenience targets; scripts/ hold the real steps (CI runs .ci/run).
.PHONY: build setup serve test check templates bench-templates

build: ## bin/berth and the static bin/berth-agent
	CGO_ENABLED=0 go build -o bin/ ./cmd/...

setup: ## install host prerequisites, build binaries and templates (root)
	bash scripts/setup.sh --no-serve

serve: ## setup, then run berth serve
	bash scripts/setup.sh

test: ## the whole suite as CI runs it (root)
	bash scripts/test.sh

check: ## fast static checks
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	go vet ./...

templates: ## build the default and tiny template tars into /var/cache/berth/rootfs
	go run ./scripts/build-template default tiny

bench-templates: ## template import timings
	go test -run '^$$' -bench Import -benchtime 3x ./internal/template
