package cli

// benchUsage is the verb table's line for `berth bench` (listed on every GOOS).
const benchUsage = "bench [--only NAME,...] [--runs N] [--warmup N] [--json FILE] [--runtime runc|runsc|both] [--template T] [--self] [--markdown] [--from FILE.json] [--burst N] [--e2b-template T]"
