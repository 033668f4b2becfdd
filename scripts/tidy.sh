#!/usr/bin/env bash
# scripts/tidy.sh — `go mod tidy` for every module of the repository.
#
# The plugin and command modules require github.com/kpar/kpar (and each
# other) by released version, never by a replace directive, so that
# `go install github.com/kpar/kpar/cmd/kpar@latest` works. Locally, go.work
# points those requirements at this checkout; but `go mod tidy` ignores
# go.work and would try to download the required versions. So each module
# is tidied with temporary replace directives to the checkout, which are
# dropped again afterwards: go.mod keeps its versioned requirements, go.sum
# gains the third-party sums.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The version the modules require of each other; bump it when tagging a
# release (see README, "Install").
version=${KPAR_VERSION:-v0.1.0}
local_mods=(github.com/kpar/kpar=. github.com/kpar/kpar/deadletter/pgsink=deadletter/pgsink
  github.com/kpar/kpar/kparprom=kparprom github.com/kpar/kpar/route=route github.com/kpar/kpar/schema=schema)
for dir in $(./scripts/modules.sh); do
  (
    cd "$dir"
    self=$(go mod edit -json | sed -n 's/^\t\t"Path": "\(.*\)"$/\1/p' | head -1)
    others=()
    for m in "${local_mods[@]}"; do
      [ "${m%%=*}" = "$self" ] || others+=("$m")
    done
    drop() { for m in "${others[@]}"; do go mod edit -dropreplace="${m%%=*}"; done; }
    trap drop EXIT
    for m in "${others[@]}"; do
      rel=$(realpath --relative-to="$PWD" "$root/${m#*=}")
      [[ $rel == ..* ]] || rel=./$rel
      go mod edit -replace="${m%%=*}=$rel"
    done
    GOWORK=off go mod tidy
    for m in "${others[@]}"; do
      if grep -Eq "^(require )?[[:space:]]*${m%%=*} v" go.mod; then
        go mod edit -require="${m%%=*}@$version"
      fi
    done
  )
done
