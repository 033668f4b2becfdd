#!/usr/bin/env bash
# scripts/noop-ab.sh — the noop criterion, run by run, for one or more builds.
#
#   go build -o /tmp/kpar-a ./cmd/kpar    # (on another checkout or commit:)
#   go build -o /tmp/kpar-b ./cmd/kpar
#   scripts/noop-ab.sh 6 /tmp/kpar-a /tmp/kpar-b
#
# Runs `BIN bench --scenario noop --json` RUNS times for each binary,
# alternating the binaries run by run so that they share the machine's slow
# and fast moments, and prints one line per run: raw's rate and whole-process
# CPU per record, then each contender's ratio to raw (the criterion's
# figure: median of the bench's rounds) with its CPU per record, and OK when
# every kpar mode is at 0.85x or more. It ends with each binary's medians and
# how many of its runs were OK. On a shared machine one run's ratio moves by
# 0.1-0.2 (BENCHMARKS.md, ninth and tenth passes): compare builds by the
# medians and the counts of one sitting, never by single runs.
#
# Needs python3 (to read the JSON). Extra arguments for kpar bench go in
# KPAR_BENCH_ARGS, for instance KPAR_BENCH_ARGS="--records 3000000", or
# KPAR_BENCH_ARGS="--rounds 15" for each run's median over 15 rounds
# (about 35 s a run; BENCHMARKS.md, eleventh pass).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 RUNS BIN [BIN...]" >&2
  exit 2
fi
runs=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT

for i in $(seq 1 "$runs"); do
  for bin in "$@"; do
    # shellcheck disable=SC2086 # KPAR_BENCH_ARGS is split on purpose
    "$bin" bench --scenario noop --json ${KPAR_BENCH_ARGS:-} 2>/dev/null |
      python3 -c '
import json, sys
name = sys.argv[1]
res = {r["contender"]: r for r in json.load(sys.stdin)["results"]}
raw = res["raw"]
def ns(r):  # whole-process CPU per record
    return r["cores"] * r["seconds"] * 1e9 / r["records"]
cols = []
for c in ["naive-pool", "kpar-key", "kpar-partition", "kpar-unordered"]:
    if c in res:
        cols.append("%s %.2f (%.0fns)" % (c, res[c]["records_per_sec"] / raw["records_per_sec"], ns(res[c])))
kpar = [c for c in res if c.startswith("kpar-")]
ok = kpar and all(res[c]["records_per_sec"] / raw["records_per_sec"] >= 0.85 for c in kpar)
print("%s\traw %.1fM/s (%.0fns) | %s%s" % (name, raw["records_per_sec"] / 1e6, ns(raw), " | ".join(cols), " OK" if ok else ""))
' "$bin" | tee -a "$out"
  done
done

python3 - "$out" <<'EOF'
import collections, re, statistics, sys
ratios = collections.defaultdict(lambda: collections.defaultdict(list))
oks = collections.Counter()
runs = collections.Counter()
for line in open(sys.argv[1]):
    name, rest = line.rstrip("\n").split("\t", 1)
    runs[name] += 1
    oks[name] += rest.endswith(" OK")
    for c, r in re.findall(r"([a-z-]+) ([0-9.]+) \(", rest):
        ratios[name][c].append(float(r))
print()
for name in runs:
    med = ", ".join("%s %.2f" % (c, statistics.median(v)) for c, v in ratios[name].items())
    print("%s: %d of %d runs OK; medians: %s" % (name, oks[name], runs[name], med))
EOF
