#!/usr/bin/env bash
# scripts/realcluster.sh — runs the suites that honour KPAR_TEST_BROKERS
# (the engine's failure, ordering, no-loss and rebalance tests, the chaos
# tests of `kpar forward` and the PostgreSQL sink outage) against a cluster that is not in the test
# process: KPAR_TEST_BROKERS when the caller set it, else a `kpar broker`
# process started here on a free loopback port and stopped at the end.
# This exercises the real-cluster path (unique names, 6 s sessions, no
# kfake controls) where no Kafka cluster exists; extra arguments go to
# go test.
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
  echo "realcluster.sh: KPAR_TEST_BROKERS=$KPAR_TEST_BROKERS" >&2
  go test -race -count=1 -timeout 5m "$@" .
  (cd cmd/kpar && go test -race -count=1 -timeout 5m -run 'TestChaos' "$@" .)
  # Skips without KPAR_TEST_POSTGRES.
  (cd deadletter/pgsink && go test -race -count=1 -timeout 5m -run 'TestChaos' "$@" .)
}

if [ -n "${KPAR_TEST_BROKERS:-}" ]; then
  run "$@"
  exit
fi

tmp=$(mktemp -d /tmp/kpar-realcluster.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
(cd cmd/kpar && go build -o "$tmp/kpar" .)
# The broker prints one line once it listens; read it from a FIFO, which
# blocks until it comes (no polling). fd 3 stays open, so the broker never
# writes to a closed pipe.
mkfifo "$tmp/out"
"$tmp/kpar" broker --listen 127.0.0.1:0 --partitions 4 >"$tmp/out" 2>"$tmp/err" &
pid=$!
exec 3<"$tmp/out"
if ! read -r -t 60 line <&3; then
  echo "realcluster.sh: kpar broker did not start:" >&2
  cat "$tmp/err" >&2
  exit 1
fi
export KPAR_TEST_BROKERS=${line#kpar broker listening on }
run "$@"
