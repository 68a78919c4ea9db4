#!/usr/bin/env bash
# GPU step for the lead: B4 elementwise (host fast path), launch overhead, training sanity.
# Each step has its own timeout; logs under $OUT; a short summary table last.
#   OUT=/some/dir bash bench/h200_extra.sh        (total budget ~200 s)
set -u
OUT=${OUT:-bench/results/logs/h200_extra}
mkdir -p "$OUT"
export CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a}
declare -a SUMMARY
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  SUMMARY+=("| $name | $rc | $(( $(date +%s) - t0 )) s | $OUT/$name.log |")
  echo "== $name rc=$rc"; tail -n 25 "$OUT/$name.log"
}
step elementwise_b4 60 python bench/elementwise.py --sections b4 --json "$OUT/elementwise_b4.json"
step launch_overhead 40 python bench/launch_overhead.py
cp bench/results/launch_overhead.json "$OUT/" 2>/dev/null
step train_sanity 100 python bench/train_sanity.py --json "$OUT/train_sanity.json" --md "$OUT/train_sanity.md"
echo; echo "| step | rc | wall | log |"; echo "|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
grep -h "fwd+bwd" "$OUT/elementwise_b4.md" 2>/dev/null
grep -h "^| [a-z]*_[a-z]* |" "$OUT/train_sanity.md" 2>/dev/null | head -8
