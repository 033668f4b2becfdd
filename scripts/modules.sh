#!/usr/bin/env bash
# scripts/modules.sh — the directories of the repository's modules, one a
# line, relative to the root: the modules go.work uses.
set -euo pipefail
cd "$(dirname "$0")/.."
go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p'
