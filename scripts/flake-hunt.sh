#!/usr/bin/env bash
# scripts/flake-hunt.sh — hunts flaky tests: runs each package's tests with
# -race -count=N (default 20) beside two CPU-bound processes, as on a
# shared CI machine, through scripts/test.sh (which installs and starts
# what the tests need), and keeps each package's output in DIR (default
# /tmp/kpar-flakes). go test prints the output of every failing run; the
# summary counts the failures per test.
#
#   scripts/flake-hunt.sh [-n N] [-o DIR] [PKG ...]
#
# PKG is a package path relative to the repository root (./cmd/kpar);
# the default is every package with tests in every module. The root
# package and cmd/kpar take a few minutes per run beside the hogs.
set -euo pipefail
cd "$(dirname "$0")/.."
n=20
out=/tmp/kpar-flakes
while getopts n:o: f; do
  case $f in
  n) n=$OPTARG ;;
  o) out=$OPTARG ;;
  *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
mkdir -p "$out"

pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
  root=$PWD
  for dir in $(./scripts/modules.sh); do
    while read -r p; do
      [ -n "$p" ] && pkgs+=(".${p#"$root"}")
    done < <(cd "$dir" && go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' ./...)
  done
fi

hogs=()
for _ in 1 2; do
  (while :; do :; done) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT

failed=0
for p in "${pkgs[@]}"; do
  [ "$p" = "." ] || p=${p%/}
  log="$out/$(printf '%s' "${p#./}" | tr / _ | sed 's/^$/root/;s/^\.$/root/').log"
  start=$(date +%s)
  if KPAR_TEST_PKGS="$p" ./scripts/test.sh -count="$n" -timeout 0 >"$log" 2>&1; then
    res=ok
  else
    res=FAIL
    failed=$((failed + 1))
  fi
  echo "$res $p: $n runs in $(($(date +%s) - start))s, $log"
done

echo "failures per test:"
cat "$out"/*.log | grep -E '^\s*--- FAIL' | sed -E 's/ \([0-9.]+s\)$//' | sort | uniq -c | sort -rn || echo "  none"
[ "$failed" -eq 0 ]
