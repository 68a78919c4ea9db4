#!/usr/bin/env bash
# One device call that checks and measures everything GPU-side, for the H200 device tool:
#   source .payload/setup.sh || exit 3; export FAP_COMMIT=<sha>; source bench/device_env.sh || exit 4;
#   bash bench/h200_all.sh [steps...]
# Each step writes $OUT/<step>.log under its own time limit; a one-line summary per step
# and the short result tables come last. Steps: asm api fwd bwd window gqa final launch elem
# split (forward loop variants) gemma2 elembench.
set -u
OUT=${OUT:-/tmp/fap_out}
mkdir -p "$OUT"
steps=${*:-asm api gqa launch}

run_step() {  # name seconds command...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-150)" >> "$OUT/summary.txt"
}

for s in $steps; do
  case $s in
    asm)    run_step asm 100 python3 tests/test_asm_gpu.py ;;
    api)    run_step api 240 python3 -m pytest -q -m gpu -s tests/test_api_gpu.py ;;
    fwd)    run_step fwd 240 python3 -m pytest -q -m gpu tests/test_attn_fwd_gpu.py tests/test_attn_fwd_split.py ;;
    bwd)    run_step bwd 240 python3 -m pytest -q -m gpu tests/test_attn_bwd_gpu.py ;;
    gqa)    run_step gqa 300 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json" ;;
    final)  run_step final 400 python3 bench/h200_final.py --graph --json "$OUT/gqa_4096.json" ;;
    launch) run_step launch 120 python3 bench/launch_overhead.py ;;
    elem)   run_step elem 200 python3 -m pytest -q -m gpu tests/test_elementwise_gpu.py ;;
    window) run_step window 300 python3 -m pytest -q -m gpu tests/test_window_gpu.py ;;
    split)  run_step split 240 python3 tests/test_attn_fwd_split.py --out "$OUT/split" ;;
    gemma2) run_step gemma2_d128 150 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
            run_step gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json" ;;
    elembench) run_step elembench 300 python3 bench/elementwise.py --json "$OUT/elementwise.json" ;;
    *) echo "unknown step $s" >> "$OUT/summary.txt" ;;
  esac
done
for f in asm launch; do [ -f "$OUT/$f.log" ] && { echo "== $f"; tail -n 25 "$OUT/$f.log"; }; done
for f in api final; do [ -f "$OUT/$f.log" ] && { echo "== $f"; grep -E "rel L2|PASS|FAIL|passed|failed|Error|skip" "$OUT/$f.log" | tail -n 40; }; done
[ -f "$OUT/gqa_4096.md" ] && { echo "== gqa"; cat "$OUT/gqa_4096.md"; }
echo "== summary"; cat "$OUT/summary.txt"
