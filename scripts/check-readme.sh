#!/usr/bin/env bash
# scripts/check-readme.sh — every complete Go program in the docs compiles.
#
#   scripts/check-readme.sh                  # README.md and docs/*.md
#   scripts/check-readme.sh docs/library.md  # the files named
#
# A complete program is a ```go block holding a `package main` line. Each
# one is written to a module of its own in a temporary directory, joined
# to this checkout's modules by a temporary go.work (the repository's, with
# absolute paths), so it builds against the code beside it, as a user's
# program would against a release. Each program must build (go build) and
# be gofmt-clean. A failure names the Markdown file and the line of the
# compiler's complaint in it; the script exits 1 if any program fails.
# Snippets without `package main` are not checked: they name or define what
# they use in the prose around them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ $# -gt 0 ]; then
  files=("$@")
else
  files=(README.md docs/*.md)
fi

tmp=$(mktemp -d /tmp/kpar-check-readme.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Extract: one directory per program, $tmp/ID/main.go (ID made of the file
# name and the line), and a line "ID FILE LINE" in $tmp/index, LINE being
# the Markdown line of the program's first line.
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "check-readme: no file $f" >&2; exit 2; }
  awk -v file="$f" -v tmp="$tmp" '
    function flush() {
      if (ismain) {
        id = file; gsub(/[^A-Za-z0-9]/, "_", id)
        dir = tmp "/" id "_" start
        system("mkdir -p " dir)
        printf "%s", body > (dir "/main.go")
        close(dir "/main.go")
        print id "_" start, file, start >> (tmp "/index")
      }
    }
    !inblock && /^```go[ \t]*$/ { inblock = 1; start = NR + 1; body = ""; ismain = 0; next }
    inblock && /^```[ \t]*$/     { flush(); inblock = 0; next }
    inblock {
      body = body $0 "\n"
      if ($0 ~ /^package main[ \t]*$/) ismain = 1
    }
    END { if (inblock) { print file ":" start ": unterminated ```go block" > "/dev/stderr"; exit 1 } }
  ' "$f"
done

if [ ! -s "$tmp/index" ]; then
  echo "check-readme: no complete Go program (a \`\`\`go block with package main) in ${files[*]}" >&2
  exit 1
fi

# The workspace: this checkout's go.work with its relative paths made
# absolute, plus one module per program.
sed -e "s#^\([[:space:]]*\)\.\$#\1$root#" \
    -e "s#^\([[:space:]]*\)\./#\1$root/#" \
    -e "s#=> \./#=> $root/#" go.work >"$tmp/go.work"
[ -f go.work.sum ] && cp go.work.sum "$tmp/go.work.sum"
export GOWORK="$tmp/go.work" GOFLAGS=-mod=readonly
while read -r id _ _; do
  printf 'module example.com/docs/%s\n\ngo 1.26\n' "$id" >"$tmp/$id/go.mod"
  (cd "$tmp" && go work use "./$id")
done <"$tmp/index"

# Build each program; map the compiler's "./main.go:L:C" back to the
# Markdown file's line.
failed=0
checked=0
while read -r id file start; do
  checked=$((checked + 1))
  if ! out=$(cd "$tmp/$id" && go build -o /dev/null . 2>&1 </dev/null); then
    failed=$((failed + 1))
    echo "check-readme: the Go program at $file:$start does not compile:" >&2
    printf '%s\n' "$out" | awk -v file="$file" -v start="$start" '
      match($0, /main\.go:[0-9]+/) {
        line = substr($0, RSTART + 8, RLENGTH - 8) + start - 1
        rest = substr($0, RSTART + RLENGTH)
        print "  " file ":" line rest
        next
      }
      /^#/ { next }
      { print "  " $0 }
    ' >&2
    continue
  fi
  if [ -n "$(gofmt -l "$tmp/$id/main.go")" ]; then
    failed=$((failed + 1))
    echo "check-readme: the Go program at $file:$start is not gofmt-clean; gofmt would change it so:" >&2
    { gofmt -d "$tmp/$id/main.go" || true; } | tail -n +4 | sed 's/^/  /' >&2
  fi
done <"$tmp/index"

if [ "$failed" -gt 0 ]; then
  echo "check-readme: $failed of $checked Go programs in the docs fail" >&2
  exit 1
fi
echo "check-readme: all $checked Go programs in ${#files[@]} files compile"
