#!/usr/bin/env bash
# One device call: every GPU test tier in parallel processes (correctness only; compile is
# CPU-bound and the H200 has 16 cores), then the timed benchmarks one at a time.
#   source .payload/setup.sh || exit 3; export FAP_COMMIT=<sha>; source bench/device_env.sh || exit 4
#   bash bench/h200_round.sh        # logs, JSON and Markdown in $OUT/round.tgz; summary last
set -u
OUT=${OUT:-/tmp/fap_out}; mkdir -p "$OUT"; S=$SECONDS
t() { local n=$1 s=$2; shift 2; timeout "$s" "$@" > "$OUT/$n.log" 2>&1
      echo "$n rc=$? t=$((SECONDS - S))s $(tail -n 1 "$OUT/$n.log" | cut -c1-120)" >> "$OUT/summary.txt"; }
# 1. correctness, in parallel
t fwd 200 python3 -m pytest -q -m gpu tests/test_attn_fwd_gpu.py &
t api 200 python3 -m pytest -q -m gpu tests/test_api_gpu.py &
t win_a 200 python3 -m pytest -q -m gpu tests/test_window_gpu.py -k "softmax or softcap-native" &
t win_b 200 python3 -m pytest -q -m gpu tests/test_window_gpu.py -k "not softmax and not softcap-native" &
t bwd 200 python3 -m pytest -q -m gpu tests/test_attn_bwd_gpu.py &
t det 200 python3 -m pytest -q -m gpu tests/test_attn_bwd_deterministic_gpu.py &
wait
# 2. timing, one at a time
t gqa 200 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
t det_time 80 python3 bench/attn_bwd_check.py --skip-check --time --deterministic --modes softmax,softcap
t gemma2_d128 90 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
t gemma2_d256 90 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
t elembench $(( ${BUDGET_S:-560} - (SECONDS - S) )) python3 bench/elementwise.py --json "$OUT/elementwise.json"
grep -h -E "^(FAILED|ERROR)" "$OUT"/*.log | head -20
tail -n 12 "$OUT/det_time.log"
echo "== summary"; cat "$OUT/summary.txt"
# the device tool returns only a few files per call: everything travels in one archive
(cd "$OUT" && tar czf /tmp/round.tgz --exclude=round.tgz . && rm -rf "$OUT"/* && mv /tmp/round.tgz "$OUT/")
