#!/usr/bin/env bash
# scripts/test.sh — the one test command (README, .ci/run).
# Installs what the tests need when it is missing (kcat, PostgreSQL,
# Chromium for the status-page test, Node.js, npm and Flask for the
# endpoint examples, and express from examples/node/package-lock.json),
# starts a PostgreSQL server on 127.0.0.1 for the dead-letter tests, then
# runs `go test -race` over every module of go.work (./... from the root
# covers the root module only) with any extra arguments passed through,
# and the real-cluster suites against a `kpar broker` process
# (scripts/realcluster.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
python3 -c 'import flask' >/dev/null 2>&1 || /usr/bin/python3 -c 'import flask' >/dev/null 2>&1 || need+=(python3-flask)
command -v buildah >/dev/null 2>&1 || need+=(buildah) # scripts/image-test.sh
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]}; tests that need them will skip" >&2
  fi
fi
# express for examples/node, exactly as its package-lock.json says.
if command -v npm >/dev/null 2>&1; then
  (cd examples/node && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "test.sh: npm ci in examples/node failed; the node example will skip (fail under CI)" >&2
  # Confluent's serializers for the typed-records interop test.
  (cd examples/serializers && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "test.sh: npm ci in examples/serializers failed; the interop test will skip (fail under CI)" >&2
fi

# PostgreSQL: use KPAR_TEST_POSTGRES when the caller set it, else start a
# throwaway server owned by this run on 127.0.0.1:55432.
if [ -z "${KPAR_TEST_POSTGRES:-}" ] && ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -1)")
  pgdir=$(mktemp -d /tmp/kpar-pg.XXXXXX)
  run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
  [ "$(id -u)" = 0 ] && chown postgres "$pgdir"
  if run_pg "$pgbin/initdb" -D "$pgdir/data" -U kpar --auth=trust >/dev/null &&
     run_pg "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w \
       -o "-h 127.0.0.1 -p 55432 -k $pgdir" start >/dev/null; then
    trap 'run_pg "$pgbin/pg_ctl" -D "$pgdir/data" -m fast stop >/dev/null 2>&1; rm -rf "$pgdir"' EXIT
    export KPAR_TEST_POSTGRES="postgres://kpar@127.0.0.1:55432/postgres?sslmode=disable"
  else
    echo "test.sh: could not start PostgreSQL (see $pgdir/log); PostgreSQL tests will skip" >&2
  fi
fi

# -count=1: CI runs every test, never a cached result. KPAR_TEST_PKGS narrows
# the packages (default: ./... of every module, run from the repository
# root); extra arguments go to go test and win.
if [ -n "${KPAR_TEST_PKGS:-}" ]; then
  go test -race -count=1 -timeout 15m "$@" $KPAR_TEST_PKGS # not exec: the EXIT trap stops PostgreSQL
  exit
fi
# The sarama bench contender is built only with -tags sarama (it would
# otherwise weigh on every kpar binary): at least compile and vet it.
(cd cmd/kpar && go vet -tags sarama ./bench/)
pkgs=()
for dir in $(./scripts/modules.sh); do pkgs+=("$dir/..."); done
go test -race -count=1 -timeout 15m "$@" "${pkgs[@]}"
# The real-cluster path (KPAR_TEST_BROKERS): when the caller did not point
# the run above at a cluster, run its suites once more against a `kpar
# broker` process, so the path is exercised where no Kafka cluster exists.
if [ -z "${KPAR_TEST_BROKERS:-}" ]; then
  ./scripts/realcluster.sh "$@"
fi
./scripts/check-readme.sh # every complete Go program in README.md and docs/ compiles
./scripts/image-test.sh # builds the image with buildah and runs kpar demo and kpar forward in it
