#!/usr/bin/env bash
# Device calls in two phases (each fits one 600 s call on the H200):
#   source .payload/setup.sh || exit 3; export FAP_COMMIT=<sha>; source bench/device_env.sh || exit 4
# (FAP_COMMIT as a literal sha typed here: `git rev-parse` on the device read stale metadata once)
#   bash bench/h200_round.sh tests   # every GPU test file, in parallel processes (compile is CPU-bound)
#   bash bench/h200_round.sh tests_split  # the same, then D=256 chunked vs split-warpgroup bwd timing
#   bash bench/h200_round.sh bench   # the timed runs, one at a time
#   bash bench/h200_round.sh d256    # head-dim-256 backward tests + bench/gemma2.py at D = 256
#   bash bench/h200_round.sh lpt     # CTA-order variant: its tests, forward and backward timings
#   bash bench/h200_round.sh r2      # kernel_breakdown, gemma2 D=256/128, elementwise eager and --graph
#   bash bench/h200_round.sh stages  # 3-stage K/V (fwd) and Q/dO (bwd) pipelines vs 2: tests, timings
#   bash bench/h200_round.sh final3  # D = 256 forward LPT (bench/fwd_tuning.py), then gqa_4096 --graph
#   bash bench/h200_round.sh lpt256  # forward LPT at D = 256: fwd/api/transformers tests, gemma2 D = 256
#   bash bench/h200_round.sh accuracy  # bench/accuracy.py: output and gradient error, poly vs native
#   bash bench/h200_round.sh final   # backward/hf tests, gqa_4096 and gemma2 D = 256 / 128 tables
#   bash bench/h200_round.sh mainloop  # backward mainloop v2 vs v1: bwd/det/api tests, then timing
#   bash bench/h200_round.sh vdo     # V on the first dO barrier: its tests and timing, then gqa_4096
#   bash bench/h200_round.sh final4  # backward/det/api/window tests, v_with_do timing, gqa_4096
#   bash bench/h200_round.sh breakdown  # kernel_breakdown.py, then gemma2 at D = 128
#   bash bench/h200_round.sh headloop  # backward head_loop: tests, then timing vs the per-query-head grid
#   bash bench/h200_round.sh hl2     # head_loop tests + timing, then bench/poly_split.py
#   bash bench/h200_round.sh final5  # FP16 poly defaults + head_loop_auto: all GPU tests, gqa_4096
#   bash bench/h200_round.sh final7  # eager autograd.Function path + FP16 sigmoid/poly: all GPU tests, gqa_4096
#   bash bench/h200_round.sh next1   # tail + mx in one call
#   bash bench/h200_round.sh rsc     # row_sum_carry: GPU tests of the knob, forward timing beside the default
#   bash bench/h200_round.sh mdesc   # backward head_loop knobs m_desc / fast_divmod: tests + timing (not yet run)
#   bash bench/h200_round.sh final9  # every GPU test file + gqa_4096 shuffled (current defaults; not yet run)
#   bash bench/h200_round.sh fixmax  # softcap constant row max: its GPU tests, forward timing D = 128 / 256 vs the online max
#   bash bench/h200_round.sh fixmax2 # under fixed_max: poly_split softcap (time + accuracy), gqa_4096 shuffled
#   bash bench/h200_round.sh final10 # softcap split 1/8 + fixed_max: softcap GPU tests, gemma2 D = 256, gqa_4096 pairs
#   bash bench/h200_round.sh lazy    # online softmax stale-max threshold (rescale_threshold=8): tests, timing D = 128 / 256 (not yet run)
#   bash bench/h200_round.sh tail8   # softmax rescale_threshold=8 default: tests, D = 64 timing; poly_split tail / 1/16 / rsum rows
#   bash bench/h200_round.sh grad    # softcap backward grad rule value / block x programs: tests, poly_split time + accuracy
#   bash bench/h200_round.sh final11 # new softcap / softmax defaults: softcap GPU tests, Gemma-2 D = 256, goal pairs
#   bash bench/h200_round.sh next12  # Gemma-2 D = 256 with the one-region softcap program beside the default; sigmoid 1/16
#   bash bench/h200_round.sh rest13  # window (softmax, sigmoid), deterministic, pre/post, torch.compile, elementwise, asm GPU tests
#   bash bench/h200_round.sh final13 # pre/post tests, Gemma-2 D = 256 one- vs two-region program, gqa_4096 shuffled
#   bash bench/h200_round.sh sc14    # one- vs two-region softcap on 1/16 (time, accuracy), softcap GPU tests
#   bash bench/h200_round.sh final14 # Gemma-2 D = 256 (with two-region rows) and 128, goal pairs, under the final defaults
#   bash bench/h200_round.sh ncu47   # Nsight Compute, final defaults: forward (anchor; Gemma-2 D = 256) and backward, pipe use + stall samples
#   bash bench/h200_round.sh x52     # exp2 offload as the BF16 softcap poly default: API / transformers / torch.compile GPU tests, goal pairs
#   bash bench/h200_round.sh x53     # Gemma-2 D = 256 / 128, ours + FA4 rows, under it (the FP16 tanh program as an extra row)
#   bash bench/h200_round.sh x50     # the exp2 offload (program exp2_f32_d3): its GPU tests, its goal pairs timed alone
#   bash bench/h200_round.sh x51     # the exp2 offload: accuracy (softcap rows), Gemma-2 D = 128 / 256 with its rows
#   bash bench/h200_round.sh e2f49   # exp2_fma=1 / 2 for softcap native and poly at D = 128 again (21 shuffled rounds, twice)
#   bash bench/h200_round.sh clk48   # Gemma-2 D = 256 / 128, ours native vs poly, shuffled, with SM clock and power per row
#   bash bench/h200_round.sh all46   # every GPU test file (persistent, knobs and PTX blocks included) under the final defaults
#   bash bench/h200_round.sh e2f45   # exp2 on the FMA pipe for 1-4 of 8 column groups (exp2_fma), softcap D = 128, side by side
#   bash bench/h200_round.sh rest44  # non-softcap forward / API / window GPU tests and the D = 256 sigmoid backward ones
#   bash bench/h200_round.sh tl43    # three-warpgroup softcap: the two-region program at 1/8, 1/4, 1/2 beside the odd_u2 default, side by side
#   bash bench/h200_round.sh fin42   # deterministic, pre/post, torch.compile tests + training sanity, then every gqa_4096 row shuffled
#   bash bench/h200_round.sh wgd41   # softcap D = 128 default on three warpgroups, split 1/8: softcap GPU tests, goal pairs, accuracy, Gemma-2 D = 128
#   bash bench/h200_round.sh sp40    # D = 256 poly split 1/8 (forward and backward agree): its GPU tests; three-WG split sweep; Gemma-2 D = 256
#   bash bench/h200_round.sh wg38    # (run 2026-11-30, b6410e8): three consumer warpgroups (tile_m 192, tile_n 64): GPU tests, then timing at D = 128
#   bash bench/h200_round.sh ho37    # (run 2026-11-30, b6410e8): ping-pong hand-over halfway through the stage: its GPU tests, then timing D = 128 / 256
#   (la35 / la36: the lookahead forward, measured and removed; its code and phases are in commit 45b6790)
#   bash bench/h200_round.sh knobs34 # GPU tests of pingpong_arrive=qk and tile_n 64 at D = 128 (tests/test_attn_fwd_knobs_gpu.py)
#   bash bench/h200_round.sh tn33    # softcap D = 128, tile_n 64: ping-pong off for poly, 3 / 4 K/V stages, side by side
#   bash bench/h200_round.sh tn32    # tile_n 64 at D = 128 for softcap / softmax (2 and 4 K/V stages, +- ping-pong), side by side
#   bash bench/h200_round.sh pp31    # ping-pong hand-over once the QK GEMM landed (pingpong_arrive=qk), D = 128 / 256, side by side
#   bash bench/h200_round.sh fence29 # stage_fence (PV wait below the stage) +- ping-pong for softcap/sigmoid, D = 128 and 256, side by side
#   bash bench/h200_round.sh ncu28   # Nsight Compute of one warm forward launch: softmax, softcap native (+ping-pong), softcap poly, sigmoid native
#   bash bench/h200_round.sh warp27  # MUFU/FMA issue rates with one / two warps per quadrant; per-tile cost of the persistent forward
#   bash bench/h200_round.sh pers26  # persistent forward default: backward, deterministic, pre/post, torch.compile GPU tests (they run the forward)
#   bash bench/h200_round.sh pers25  # persistent forward default: forward/API/window/transformers tests, goal pairs, Gemma-2 D = 256 / 128
#   bash bench/h200_round.sh pers24  # persistent forward: its GPU tests, then forward timing vs the default at D = 128 and 256
#   bash bench/h200_round.sh all23   # per-CTA fixed cost (bench/cta_overhead.py), then every GPU test file and the PTX blocks
#   bash bench/h200_round.sh mend22  # odd_u2 + softcap GPU tests after the review mend of the u2 clamp scalars
#   bash bench/h200_round.sh final21 # deterministic, pre/post, torch.compile GPU tests and training sanity under the odd_u2 default
#   bash bench/h200_round.sh final20 # the odd_u2 softcap default: softcap + deterministic GPU tests, issue rates, goal pairs, Gemma-2 D = 256
#   bash bench/h200_round.sh odd19   # odd_u2 with 6 coefficients, backward MUFU columns as native's: tests, poly_split, Gemma-2 D = 256 twice
#   bash bench/h200_round.sh odd18   # odd_u2 softcap program (fit/softcap_odd.py): GPU tests, poly_split rows, Gemma-2 D = 256
#   bash bench/h200_round.sh rates17 # bench/issue_rates.py (F2FP / unpack / MUFU mixes), then elem16's steps
#   bash bench/h200_round.sh final15 # deterministic + pre/post tests, train_sanity.py, elementwise_variants.py
#   bash bench/h200_round.sh elem16  # B4 SwiGLU tuning variants, elementwise GPU tests, elementwise --graph (not yet run)
#   bash bench/h200_round.sh shuf    # every gqa_4096 row, shuffled order (the README table)
#   bash bench/h200_round.sh acc     # fixed_max_rsum / rescale_threshold: tests, bench/fwd_knob_accuracy.py, timing D 128/256 (not yet run)
#   bash bench/h200_round.sh partner # pairs with SM clocks, then with the GPU idle 200 ms before each segment (not yet run)
#   bash bench/h200_round.sh pairs   # gqa_4096 --pairs: every goal pair timed alone, 5 repeats
#   bash bench/h200_round.sh fair    # gqa_4096 ours+FA4 only, then all rows shuffled (power-cap neighbour bias)
#   bash bench/h200_round.sh tail    # softcap_c50_f16_tail (opt-in): PTX blocks on the GPU, its API tests, accuracy.py (not yet run)
#   bash bench/h200_round.sh mx      # forward knobs row_max_chains=4 and ping-pong for the native stages, side by side (not yet run)
#   bash bench/h200_round.sh clk     # gqa_4096 --clocks --graph-bwd: SM clock / power per row, backward as a CUDA graph (not yet run)
#   bash bench/h200_round.sh zdq2    # zero_dq timing alone, then the pre/post tests
#   bash bench/h200_round.sh zdq     # dQ accumulator zeroed in the pre kernel: its tests, then timing (not yet run)
#   bash bench/h200_round.sh final8  # Gemma-2 D = 256 and 128 tables, then train_sanity.py (eager path, FP16 defaults)
#   bash bench/h200_round.sh final6  # accuracy.py and gemma2.py D = 256 under those defaults
#   bash bench/h200_round.sh fp16sig # FP16-input sigmoid/poly kernel tests (built, not GPU-run yet)
#   bash bench/h200_round.sh bd      # kernel_breakdown.py alone
#   bash bench/h200_round.sh hp      # FP16 API tests, then bench/host_profile.py (cProfile of each call)
#   bash bench/h200_round.sh hc      # API + compiled-step tests, then bench/host_cost.py and bench/call_timeline.py
#   bash bench/h200_round.sh tl      # FP16-input sigmoid/poly kernel + API tests, then bench/call_timeline.py
#   bash bench/h200_round.sh split   # bench/poly_split.py: BF16/FP16 programs x column split, time + accuracy
#   bash bench/h200_round.sh f16     # FP16 programs: asm/kernel/API tests, accuracy rows, gqa_4096 with f16 rows
# Logs, JSON and Markdown travel back in $OUT/round_<phase>.tgz (the device tool returns only a
# few files per call); the summary is printed last.
set -u
OUT=${OUT:-/tmp/fap_out}; mkdir -p "$OUT"; S=$SECONDS; phase=${1:-tests}
t() { local n=$1 s=$2; shift 2; timeout "$s" "$@" > "$OUT/$n.log" 2>&1
      echo "$n rc=$? t=$((SECONDS - S))s $(tail -n 1 "$OUT/$n.log" | cut -c1-120)" >> "$OUT/summary.txt"; }
pt() { local n=$1; shift; t "$n" 400 python3 -m pytest -q -m gpu "$@"; }
# everything under $OUT so far into $OUT/round_<phase>.tgz (phases call it after each step)
tarup() { (cd "$OUT" && tar czf "/tmp/round_$phase.tgz" --exclude="round_$phase.tgz" . && mv "/tmp/round_$phase.tgz" "$OUT/"); }
# leave only the archive and the summary (the device tool returns only ~8 files)
only_archive() { find "$OUT" -maxdepth 1 -type f ! -name "round_$phase.tgz" ! -name summary.txt -delete; }
all_gpu_tests() {   # every GPU test file, in parallel processes (compile is CPU-bound); $@: extra elem files
  pt fwd tests/test_attn_fwd_gpu.py &
  pt api tests/test_api_gpu.py &
  pt win_a tests/test_window_gpu.py -k "softmax or softcap-native" &
  pt win_b tests/test_window_gpu.py -k "not softmax and not softcap-native" &
  pt bwd tests/test_attn_bwd_gpu.py &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  pt compile tests/test_compile_gpu.py &
  pt hf tests/test_transformers_gpu.py &
  pt elem tests/test_elementwise_gpu.py "$@" &
  wait
}
elem16_steps() {   # elementwise GPU tests, B4 SwiGLU tuning variants, elementwise CUDA-graph timing
  pt elem tests/test_elementwise_gpu.py; tarup
  t elem_var_b4 150 python3 bench/elementwise_variants.py --kinds swiglu_fwd,swiglu_bwd \
      --json "$OUT/elementwise_variants_b4.json"; tarup
  t elem_graph 150 python3 bench/elementwise.py --graph --json "$OUT/elementwise_graph.json"; tarup
}
odd_tests() {   # the odd_u2 softcap program's GPU tests and the PTX blocks on the GPU, in parallel
  pt fwd_odd tests/test_attn_fwd_gpu.py -k softcap_odd &
  pt bwd_odd tests/test_attn_bwd_gpu.py -k "grad_rules and odd" &
  pt asm tests/test_asm_gpu.py &
  wait; tarup
}
gqa_shuffle() {   # every gqa_4096 row, shuffled order, 9 rounds, clocks and graph columns
  t gqa_shuf 330 python3 bench/gqa_4096.py --order shuffle --rounds 9 --clocks --graph-bwd \
      --json "$OUT/gqa_4096_shuffle.json"; tarup
}
softcap_tests() {   # softcap GPU tests in parallel ($1 = 1: the window tests too)
  pt fwd_sc tests/test_attn_fwd_gpu.py -k softcap &
  pt api_sc tests/test_api_gpu.py -k softcap &
  pt bwd_sc tests/test_attn_bwd_gpu.py -k softcap &
  [ "$1" = 1 ] && pt win_sc tests/test_window_gpu.py -k softcap &
  pt hf tests/test_transformers_gpu.py &
  wait; tarup
}
softcap_round() {   # softcap_tests ($1 as there), then Gemma-2 D = 256 and the goal pairs ($2: their time budget, s)
  softcap_tests "$1"
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  t gqa_pairs "$2" python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
}
if [ "$phase" = tests ] || [ "$phase" = tests_split ]; then
  all_gpu_tests
  [ "$phase" = tests_split ] && t split_wg_time 200 python3 bench/attn_bwd_check.py --skip-check --split-wg
elif [ "$phase" = d256 ]; then   # D = 256 backward, dQ async and the transformers tests; then timings
  pt bwd tests/test_attn_bwd_gpu.py &
  pt api256 tests/test_api_gpu.py -k "head_dim_256" &
  pt det256 tests/test_attn_bwd_deterministic_gpu.py -k "256" &
  pt pp256 tests/test_attn_bwd_prepost_gpu.py -k "256" &
  pt hf tests/test_transformers_gpu.py &
  pt compile tests/test_compile_gpu.py &
  wait
  t bwd_variants 150 python3 bench/attn_bwd_check.py --skip-check --variants --modes softmax,softcap \
      --json "$OUT/attn_bwd_variants.json"
  t gemma2_d256 200 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
elif [ "$phase" = r2 ]; then   # per-kernel device times, Gemma-2 tables, elementwise eager + CUDA-graph
  t breakdown 140 python3 bench/kernel_breakdown.py --json "$OUT/kernel_breakdown.json"
  t gemma2_d256 110 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
  t gemma2_d128 90 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
  t elem 110 python3 bench/elementwise.py --json "$OUT/elementwise.json"
  t elem_graph 110 python3 bench/elementwise.py --graph --json "$OUT/elementwise_graph.json"
elif [ "$phase" = stages ]; then   # 3-stage pipelines: bwd tests, then fwd and bwd timings 2 vs 3 stages
  pt bwd_st3 tests/test_attn_bwd_gpu.py -k stages3
  t split_st3 200 python3 tests/test_attn_fwd_split.py --out "$OUT/split" --only \
"softmax v2 lpt,softmax v2 lpt s3,softcap native v2 lpt,softcap native v2 lpt s3,sigmoid native v2 lpt,\
sigmoid native v2 lpt s3,softcap poly 1/2 v2 pp lpt,softcap poly 1/2 v2 pp lpt s3,sigmoid poly 1/4 v2 pp lpt,\
sigmoid poly 1/4 v2 pp lpt s3"
  t bwd_st3_time 200 python3 bench/attn_bwd_check.py --skip-check --variants --axes stages \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_stages.json"
elif [ "$phase" = final3 ]; then   # D = 256 forward LPT side by side, then the gqa_4096 table
  t fwd_lpt_d256 150 python3 bench/fwd_tuning.py --headdim 256 --knob lpt=1 \
      --modes softmax:native,softcap:native,sigmoid:poly,sigmoid:native --json "$OUT/fwd_lpt_d256.json"
  t gqa 280 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
elif [ "$phase" = lpt256 ]; then   # forward LPT at D = 256 (default since this phase): tests, then Gemma-2 D = 256
  pt fwd tests/test_attn_fwd_gpu.py &
  pt api256 tests/test_api_gpu.py -k "head_dim_256" &
  pt hf tests/test_transformers_gpu.py &
  wait
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
elif [ "$phase" = lpt256poly ]; then   # D = 256 softcap/poly forward with LPT (spills 5 words): time, test, Gemma-2
  t fwd_lpt_d256_poly 120 python3 bench/fwd_tuning.py --headdim 256 --knob lpt=0 \
      --modes softcap:poly --json "$OUT/fwd_lpt_d256_poly.json"
  pt fwd256 tests/test_attn_fwd_gpu.py -k "256"
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
elif [ "$phase" = accuracy ]; then   # O and dQ/dK/dV error vs FP64 exact math, every mode and evaluator
  t accuracy 240 python3 bench/accuracy.py --json "$OUT/accuracy.json"
elif [ "$phase" = f16 ]; then   # FP16 programs: block bit-exact + kernel tests, accuracy, gqa (tar after each step)
  pt asm tests/test_asm_gpu.py &
  pt bwd16 tests/test_attn_bwd_gpu.py -k "f16_program" &
  pt api16 tests/test_api_gpu.py -k "_f16" &
  wait; tarup
  t accuracy 150 python3 bench/accuracy.py --modes softcap,sigmoid --json "$OUT/accuracy_f16.json"; tarup
  t gqa 280 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = headloop ]; then   # backward head_loop build: its tests, then side-by-side timing (tar after each)
  pt hl_bwd tests/test_attn_bwd_gpu.py -k "head_loop" &
  pt hl_win tests/test_window_gpu.py -k "head_loop" &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  wait; tarup
  t hl_time 330 python3 bench/attn_bwd_check.py --skip-check --variants --axes head_loop \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_head_loop.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = hl2 ]; then   # head_loop (flat loop) tests + timing, then bench/poly_split.py (tar after each)
  pt hl_bwd tests/test_attn_bwd_gpu.py -k "head_loop" &
  pt hl_win tests/test_window_gpu.py -k "head_loop" &
  wait; tarup
  t hl_time 150 python3 bench/attn_bwd_check.py --skip-check --variants --axes head_loop \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_head_loop.json"; tarup
  t split 330 python3 bench/poly_split.py --json "$OUT/poly_split.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = hl3 ]; then   # head_loop with one LPT section: a few tests, then timing
  pt hl_bwd tests/test_attn_bwd_gpu.py -k "head_loop_matches and 5000"
  t hl_time 200 python3 bench/attn_bwd_check.py --skip-check --variants --axes head_loop \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_head_loop.json"
elif [ "$phase" = final5 ]; then   # FP16 poly defaults + head_loop_auto: every GPU test file, then gqa_4096
  all_gpu_tests tests/test_asm_gpu.py; tarup
  t gqa 240 python3 bench/gqa_4096.py --json "$OUT/gqa_4096.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final7 ]; then   # eager autograd.Function path + FP16 sigmoid/poly API: every GPU test file, gqa_4096
  all_gpu_tests tests/test_asm_gpu.py; tarup
  t gqa 240 python3 bench/gqa_4096.py --json "$OUT/gqa_4096.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = next1 ]; then   # tail + mx in one call (one cold start): tail program tests and accuracy, forward knobs
  pt asm tests/test_asm_gpu.py &
  pt api_tail tests/test_api_gpu.py -k "softcap_c50_f16_tail" &
  wait; tarup
  t fwd_mx 200 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --knob row_max_chains=4 \
      --modes softmax:native,softcap:native,softcap:poly --json "$OUT/fwd_row_max_chains.json"; tarup
  t fwd_pp_softmax 150 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --knob pingpong=1 \
      --modes softmax:native,softcap:native --json "$OUT/fwd_pingpong_native.json"; tarup
  t accuracy 200 python3 bench/accuracy.py --json "$OUT/accuracy.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tail ]; then   # two-region FP16 softcap (opt-in program): blocks bit-exact, API tests, accuracy rows
  pt asm tests/test_asm_gpu.py &
  pt api_tail tests/test_api_gpu.py -k "softcap_c50_f16_tail" &
  wait; tarup
  t accuracy 240 python3 bench/accuracy.py --json "$OUT/accuracy.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = mx ]; then   # forward latency knobs at the anchor shape: 4 row-max chains; ping-pong for softmax
  t fwd_mx 200 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --knob row_max_chains=4 \
      --modes softmax:native,softcap:native,softcap:poly --json "$OUT/fwd_row_max_chains.json"; tarup
  t fwd_pp_softmax 150 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --knob pingpong=1 \
      --modes softmax:native,softcap:native --json "$OUT/fwd_pingpong_native.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = rsc ]; then   # row_sum_carry (O rescale at the PV wait): its GPU tests, then forward knobs side by side
  pt rsc_a tests/test_attn_fwd_gpu.py -k "carry1 and softmax" &
  pt rsc_b tests/test_attn_fwd_gpu.py -k "carry1 and softcap" &
  wait; tarup
  t fwd_rsc 300 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --iters 50 --rounds 7 \
      --knob row_sum_carry=1 --knob row_sum_carry=1+pingpong=1 --knob row_sum_carry=1+row_max_chains=4 \
      --modes softmax:native,softcap:native,softcap:poly --json "$OUT/fwd_row_sum_carry.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = rsc2 ]; then   # row_sum_carry with ping-pong for the native softmax stages, shuffled order, D 128 and 256
  t fwd_rsc2 200 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --iters 100 --rounds 15 \
      --order shuffle --knob pingpong=1 --knob row_sum_carry=1+pingpong=1 --knob row_sum_carry=1+pingpong=1+row_max_chains=4 \
      --modes softmax:native,softcap:native --json "$OUT/fwd_row_sum_carry_pp.json"; tarup
  t fwd_rsc2_d256 200 python3 bench/fwd_tuning.py --seqlen 8192 --hq 8 --hkv 4 --headdim 256 --iters 50 --rounds 11 \
      --order shuffle --knob row_sum_carry=1 --knob row_sum_carry=1+pingpong=1 \
      --modes softmax:native,softcap:native,softcap:poly --json "$OUT/fwd_row_sum_carry_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fwdval ]; then   # new forward defaults (softmax D128 / softcap D256 schedule): forward-path GPU tests, goal pairs, Gemma-2 D256
  pt fwd tests/test_attn_fwd_gpu.py &
  pt api tests/test_api_gpu.py &
  pt win_a tests/test_window_gpu.py -k "softmax or softcap-native" &
  pt win_b tests/test_window_gpu.py -k "not softmax and not softcap-native" &
  pt hf tests/test_transformers_gpu.py &
  wait; tarup
  t gqa_pairs 150 python3 bench/gqa_4096.py --pairs --pair-repeats 5 --json "$OUT/gqa_4096_pairs.json"; tarup
  t gemma2_d256 170 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = mdesc ]; then   # head_loop knobs (query blocks descending; fast divmod): tests, then timing
  pt hlk_a tests/test_attn_bwd_gpu.py -k "head_loop_knobs and m_desc" &
  pt hlk_b tests/test_attn_bwd_gpu.py -k "head_loop_knobs and not m_desc" &
  wait; tarup
  t mdesc_time 240 python3 bench/attn_bwd_check.py --skip-check --variants --axes m_desc,fast_divmod \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_head_loop_knobs.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final9 ]; then   # every GPU test file under the current defaults, then gqa_4096 shuffled with graph steps and clocks
  all_gpu_tests tests/test_asm_gpu.py; tarup
  t gqa_shuf 300 python3 bench/gqa_4096.py --order shuffle --rounds 9 --clocks --graph-bwd \
      --json "$OUT/gqa_4096_shuffle.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fixmax ]; then   # softcap constant row max (fixed_max): its GPU tests, then forward timing vs the online max
  pt fwd tests/test_attn_fwd_gpu.py &
  pt api_sc tests/test_api_gpu.py -k softcap &
  pt bwd_sc tests/test_attn_bwd_gpu.py -k softcap &
  pt hf tests/test_transformers_gpu.py &
  wait; tarup
  t fm128 120 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 --knob fixed_max=0 \
      --modes softcap:native,softcap:poly --order shuffle --rounds 15 --iters 100 --json "$OUT/fwd_fixed_max_d128.json"; tarup
  t fm256 150 python3 bench/fwd_tuning.py --knob fixed_max=0 --modes softcap:native,softcap:poly --order shuffle \
      --rounds 15 --iters 50 --json "$OUT/fwd_fixed_max_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fixmax2 ]; then   # under fixed_max: mended tests, softcap program x split (time + accuracy), gqa_4096 shuffled
  pt fwd_fm tests/test_attn_fwd_gpu.py -k fixed_max &
  pt api16 tests/test_api_gpu.py -k "fp16 or softcap" &
  wait; tarup
  t split_sc 240 python3 bench/poly_split.py --modes softcap --json "$OUT/poly_split_fixed_max.json"; tarup
  t gqa_shuf 300 python3 bench/gqa_4096.py --order shuffle --rounds 9 --clocks --graph-bwd \
      --json "$OUT/gqa_4096_shuffle.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final10 ]; then   # softcap poly split 1/8 default + fixed_max: softcap GPU tests, Gemma-2 D = 256, pairs
  softcap_round 0 100
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = lazy ]; then   # online-softmax stale-max threshold (rescale_threshold=8): its GPU tests, then forward timing
  pt fwd_rt tests/test_attn_fwd_gpu.py -k rescale_threshold; tarup
  t rt128 120 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 --knob rescale_threshold=8 \
      --modes softmax:native --order shuffle --rounds 15 --iters 100 --json "$OUT/fwd_rescale_threshold_d128.json"; tarup
  t rt256 150 python3 bench/fwd_tuning.py --knob rescale_threshold=8 --modes softmax:native --order shuffle \
      --rounds 15 --iters 50 --json "$OUT/fwd_rescale_threshold_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tail8 ]; then   # softmax rescale_threshold default: its tests, D = 64 timing; softcap programs x split x rsum
  pt fwd_sm tests/test_attn_fwd_gpu.py -k softmax &
  pt api_sm tests/test_api_gpu.py -k softmax &
  pt bwd_sm tests/test_attn_bwd_gpu.py -k softmax &
  wait; tarup
  t rt64 60 python3 bench/fwd_tuning.py --headdim 64 --seqlen 4096 --hq 32 --hkv 8 --knob rescale_threshold=0 \
      --modes softmax:native --order shuffle --rounds 15 --iters 100 --json "$OUT/fwd_rescale_threshold_d64.json"; tarup
  t split_tail 330 python3 bench/poly_split.py --modes softcap --only "softcap/softcap_c50_f16 1/8,\
softcap/softcap_c50_f16 1/16,softcap/softcap_c50_f16_tail 1/8,softcap/softcap_c50_f16_tail 1/16,\
softcap/native fixed_max_rsum=1,softcap/softcap_c50_f16 1/8 fixed_max_rsum=1,\
softcap/softcap_c50_f16_tail 1/8 fixed_max_rsum=1" --json "$OUT/poly_split_tail.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = grad ]; then   # softcap backward grad rules (value / block) x programs: tests, then time + accuracy
  pt bwd_rule tests/test_attn_bwd_gpu.py -k "grad_rules" &
  pt api_tail tests/test_api_gpu.py -k "tail" &
  wait; tarup
  t split_grad 330 python3 bench/poly_split.py --modes softcap --rounds 9 --only "\
softcap/softcap_c50_f16 1/8 softcap_grad=block,softcap/softcap_c50_f16 1/8 softcap_grad=value,\
softcap/softcap_c50_f16_tail 1/16 softcap_grad=block,softcap/softcap_c50_f16_tail 1/16 softcap_grad=value,\
softcap/softcap_c50_f16_tail 1/8 softcap_grad=value" --json "$OUT/poly_split_grad.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final11 ]; then   # softcap default two-region program 1/16 + value rule, softmax stale max: tests, Gemma-2, pairs
  softcap_round 1 110
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fix11 ]; then   # the tests' constant-max model (attention_ref_lowprec fixed_max), then every gqa_4096 row shuffled
  pt fwd_fm tests/test_attn_fwd_gpu.py -k "fixed_max" &
  pt win_sc tests/test_window_gpu.py -k softcap &
  wait; tarup
  gqa_shuffle
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = next12 ]; then   # Gemma-2 D = 256 one- vs two-region softcap program; sigmoid 1/16 rows
  t g256 200 python3 bench/gemma2.py --programs softcap_c50_f16 --impls ours,fa4 --json "$OUT/gemma2_d256_programs.json"; tarup
  t split_sig 240 python3 bench/poly_split.py --modes sigmoid --rounds 9 --only "sigmoid/sigmoid_attn_n4096_f16 1/8,\
sigmoid/sigmoid_attn_n4096_f16 1/16,sigmoid/sigmoid_attn_n4096 1/16" --json "$OUT/poly_split_sigmoid16.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = rest13 ]; then   # GPU test files not re-run since the 2026-11-30 defaults (rescale_threshold 8, tail 1/16, value grad)
  pt win_rest tests/test_window_gpu.py -k "not softcap" &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  pt compile tests/test_compile_gpu.py &
  pt elem tests/test_elementwise_gpu.py &
  pt asm tests/test_asm_gpu.py &
  wait; tarup
  pt fwd_sig tests/test_attn_fwd_gpu.py -k sigmoid &   # sigmoid poly default moved to 1/16
  pt bwd_sig tests/test_attn_bwd_gpu.py -k sigmoid &
  pt api_sig tests/test_api_gpu.py -k sigmoid &
  wait; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final13 ]; then   # pre/post tests (zero_dq bound), Gemma-2 D = 256 programs (JSON), every gqa_4096 row shuffled
  pt prepost tests/test_attn_bwd_prepost_gpu.py; tarup
  t g256 150 python3 bench/gemma2.py --programs softcap_c50_f16 --impls ours,fa4 --json "$OUT/gemma2_d256_programs.json"; tarup
  gqa_shuffle
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = sc14 ]; then   # one- vs two-region softcap on 1/16 (value rule): time + accuracy; softcap GPU tests under the new default
  t split_r16 200 python3 bench/poly_split.py --modes softcap --rounds 9 --only "softcap/softcap_c50_f16 1/16 softcap_grad=value,\
softcap/softcap_c50_f16_tail 1/16 softcap_grad=value" --json "$OUT/poly_split_r16.json"; tarup
  softcap_tests 1
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final14 ]; then   # the session's final defaults: Gemma-2 D = 256 (+ two-region rows) and 128, goal pairs
  t gemma2_d256 150 python3 bench/gemma2.py --programs softcap_c50_f16_tail --json "$OUT/gemma2_d256.json"; tarup
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"; tarup
  t gqa_pairs 200 python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final15 ]; then   # deterministic + pre/post tests under the one-region softcap default, training sanity, elementwise variants
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  wait; tarup
  t train 150 python3 bench/train_sanity.py --json "$OUT/train_sanity.json" --md "$OUT/train_sanity.md"; tarup
  t elem_variants 120 python3 bench/elementwise_variants.py --json "$OUT/elementwise_variants.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = elem16 ]; then   # prepared (not run): B4 SwiGLU tuning variants; the API's elementwise rows (SiLU fwd balanced grid)
  elem16_steps
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = e2f45 ]; then   # exp2 on the FMA pipe for n of 8 column groups (AttnFwdConfig.exp2_fma), softcap D = 128, side by side
  t e2f_d128 240 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:poly,softcap:native --order shuffle --rounds 11 --iters 30 \
      --knob exp2_fma=1 --knob exp2_fma=2 --knob exp2_fma=3 --knob exp2_fma=4 --json "$OUT/fwd_exp2_fma_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = rest44 ]; then   # GPU tests the tenth session's rounds did not select: non-softcap forward/API/window, D = 256 sigmoid backward
  pt fwd tests/test_attn_fwd_gpu.py -k "not softcap" &
  pt api tests/test_api_gpu.py -k "not softcap" &
  pt win tests/test_window_gpu.py -k "not softcap" &
  pt bwd tests/test_attn_bwd_gpu.py -k "256 and sigmoid" &
  wait; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tl43 ]; then   # softcap on three warpgroups: the two-region program (1.03-1.06x native's error) at wider splits
  t tail_d128 300 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:poly,softcap:native --order shuffle --rounds 11 --iters 30 \
      --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+split=1/4 --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+program=softcap_c50_f16_tail --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+split=1/4+program=softcap_c50_f16_tail \
      --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+split=1/2+program=softcap_c50_f16_tail --json "$OUT/fwd_three_wg_tail_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fin42 ]; then   # the GPU test files wgd41 did not run, training sanity, every gqa_4096 row shuffled
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  pt compile tests/test_compile_gpu.py &
  t train 240 python3 bench/train_sanity.py --json "$OUT/train_sanity.json" --md "$OUT/train_sanity.md" &
  wait; tarup
  gqa_shuffle
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = wgd41 ]; then   # softcap at D = 128 on three warpgroups (tile 192 x 64) by default, split 1/8: tests, goal pairs, accuracy, Gemma-2 D = 128
  pt fwd tests/test_attn_fwd_gpu.py -k softcap &
  pt api tests/test_api_gpu.py -k softcap &
  pt win tests/test_window_gpu.py -k softcap &
  pt bwd tests/test_attn_bwd_gpu.py -k "softcap and not 256" &
  pt pers tests/test_attn_fwd_persistent_gpu.py -k softcap &
  pt knobs tests/test_attn_fwd_knobs_gpu.py -k "pingpong_arrive and softcap" &
  wait; tarup
  t gqa_pairs 200 python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
  t accuracy 150 python3 bench/accuracy.py --modes softcap --json "$OUT/accuracy_softcap.json"; tarup
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = sp40 ]; then   # poly split 1/8 at 64-key forward blocks (D = 256): its GPU tests, three-WG split sweep, Gemma-2 D = 256
  pt fwd256 tests/test_attn_fwd_gpu.py -k 256 &
  pt bwd256 tests/test_attn_bwd_gpu.py -k "256 and (poly or test_softcap)" &
  pt hf tests/test_transformers_gpu.py &
  pt knobs tests/test_attn_fwd_knobs_gpu.py -k "tile_n64 or three_warpgroups" &
  wait; tarup
  t wg3s_d128 300 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:poly,softcap:native,softmax:native --order shuffle --rounds 11 --iters 30 \
      --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0 --knob tile_m=192+tile_n=64+num_stages=5+pingpong=0 \
      --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+split=1/4 --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0+split=1/2 \
      --json "$OUT/fwd_three_wg_split_d128.json"; tarup
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = wg38 ]; then   # prepared: three consumer warpgroups (tile_m 192, tile_n 64): GPU tests, then timing at D = 128
  pt wg3 tests/test_attn_fwd_knobs_gpu.py -k "three_warpgroups" -x; tarup
  t wg3_d128 300 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly,softmax:native,sigmoid:poly --order shuffle --rounds 9 --iters 30 \
      --knob tile_m=192+tile_n=64+num_stages=4+pingpong=0 --knob tile_n=64+num_stages=4+pingpong=0 \
      --json "$OUT/fwd_three_wg_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = ho37 ]; then   # prepared: ping-pong hand-over halfway through the stage (pingpong_arrive=stage), tests then timing
  pt knobs tests/test_attn_fwd_knobs_gpu.py -k "pingpong_arrive" -x; tarup
  t ho_d128 300 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly,softmax:native,sigmoid:native,sigmoid:poly --order shuffle --rounds 9 --iters 30 \
      --knob pingpong=1+pingpong_arrive=stage --knob pingpong=1 --json "$OUT/fwd_pingpong_stage_d128.json"; tarup
  t ho_d256 200 python3 bench/fwd_tuning.py --modes softcap:native,softcap:poly,softmax:native --order shuffle --rounds 9 --iters 30 \
      --knob pingpong=1+pingpong_arrive=stage --knob pingpong=1 --json "$OUT/fwd_pingpong_stage_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = knobs34 ]; then   # GPU tests of the selectable forward knobs (pingpong_arrive=qk, tile_n 64 at D = 128)
  pt knobs tests/test_attn_fwd_knobs_gpu.py; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tn33 ]; then   # softcap at D = 128 with tile_n 64: ping-pong off for poly, 3 / 4 K/V stages, side by side
  t tn64b_d128 330 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly --order shuffle --rounds 11 --iters 30 \
      --knob tile_n=64+num_stages=4+pingpong=0 --knob tile_n=64+num_stages=3+pingpong=0 \
      --knob tile_n=64+num_stages=4+pingpong=1 --json "$OUT/fwd_tile_n64_softcap_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tn32 ]; then   # tile_n 64 at D = 128 (half the score stage per key block), 2 / 4 K/V stages, side by side
  t tn64_d128 330 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly,softmax:native --order shuffle --rounds 9 --iters 30 \
      --knob tile_n=64 --knob tile_n=64+num_stages=4 --knob tile_n=64+pingpong=1 \
      --json "$OUT/fwd_tile_n64_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = pp31 ]; then   # ping-pong hand-over after the QK GEMM completed (pingpong_arrive=qk), D = 128 and 256
  t ppqk_d128 360 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly,softmax:native,sigmoid:native,sigmoid:poly --order shuffle --rounds 9 --iters 30 \
      --knob pingpong=1+pingpong_arrive=qk --knob pingpong=1+pingpong_arrive=qk+stage_fence=interior \
      --json "$OUT/fwd_pingpong_arrive_d128.json"; tarup
  t ppqk_d256 200 python3 bench/fwd_tuning.py --modes softcap:native,softcap:poly,softmax:native --order shuffle --rounds 9 --iters 30 \
      --knob pingpong=1+pingpong_arrive=qk --knob pingpong=1+pingpong_arrive=qk+stage_fence=interior \
      --json "$OUT/fwd_pingpong_arrive_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fence29 ]; then   # the PV wait below the whole stage (stage_fence) with ping-pong, under today's defaults
  t fence_d128 330 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
      --modes softcap:native,softcap:poly,sigmoid:native,sigmoid:poly --order shuffle --rounds 9 --iters 30 \
      --knob stage_fence=interior --knob pingpong=1+stage_fence=interior --knob pingpong=1+stage_fence=all \
      --json "$OUT/fwd_stage_fence_d128.json"; tarup
  t fence_d256 200 python3 bench/fwd_tuning.py --modes softcap:native,softcap:poly --order shuffle --rounds 9 --iters 30 \
      --knob stage_fence=interior --knob pingpong=1+stage_fence=interior \
      --json "$OUT/fwd_stage_fence_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = x52 ]; then   # the exp2 offload as attention()'s BF16 softcap poly default: API / transformers / compile GPU tests, goal pairs
  pt api tests/test_api_gpu.py &
  pt hf tests/test_transformers_gpu.py &
  pt compile tests/test_compile_gpu.py &
  pt win_x tests/test_window_gpu.py -k "exp2" &
  wait; tarup
  t gqa_pairs 200 python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = x53 ]; then   # Gemma-2 D = 256 / 128 under the new default (every row; the tanh program as an extra row)
  t gemma2_d256 250 python3 bench/gemma2.py --impls ours,fa4 --programs softcap_c50_f16_odd --json "$OUT/gemma2_d256.json"; tarup
  t gemma2_d128 200 python3 bench/gemma2.py --impls ours,fa4 --programs softcap_c50_f16_odd --headdim 128 --json "$OUT/gemma2_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = x50 ]; then   # the exp2 offload (program exp2_f32_d3): its GPU tests, then its pairs timed alone
  # (run at 59cca6e; its "exp2 program" pairs left bench/gqa_4096.py when exp2 became the default, c7a4e39)
  pt api_x tests/test_api_gpu.py -k "exp2" &
  pt asm_x tests/test_asm_gpu.py -k "exp2" &
  wait; tarup
  t pairs_x 330 python3 bench/gqa_4096.py --pairs --pair-repeats 3 --pair-names "softcap poly exp2 program vs ours native,softcap poly exp2 program vs default (odd_u2),softcap poly exp2 program vs FA4 softcap,softcap poly exp2 program vs ours softmax,softcap poly vs ours native" \
      --json "$OUT/gqa_4096_pairs_exp2.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = x51 ]; then   # the exp2 offload: accuracy rows (softcap), Gemma-2 D = 128 / 256 with its rows, shuffled
  pt api_x tests/test_api_gpu.py -k "exp2_offload_next" &
  t accuracy 200 python3 bench/accuracy.py --modes softcap --json "$OUT/accuracy_softcap.json" &
  wait; tarup
  t g128_x 170 python3 bench/gemma2.py --impls ours --programs exp2_f32_d3 --order shuffle --rounds 9 --iters 30 \
      --headdim 128 --json "$OUT/gemma2_d128_exp2.json"; tarup
  t g256_x 200 python3 bench/gemma2.py --impls ours --programs exp2_f32_d3 --order shuffle --rounds 9 --iters 30 \
      --json "$OUT/gemma2_d256_exp2.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = e2f49 ]; then   # repeat of e2f45's native exp2_fma rows (0.975x once), 21 shuffled rounds, twice
  for i in 1 2; do
    t "e2f_native_$i" 240 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 \
        --modes softcap:native,softcap:poly --order shuffle --rounds 21 --iters 30 \
        --knob exp2_fma=1 --knob exp2_fma=2 --json "$OUT/fwd_exp2_fma_native_$i.json"; tarup
  done
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = clk48 ]; then   # Gemma-2 ours native vs poly with SM clock / power per row (is poly's D = 256 loss clock?)
  t g256_clk 280 python3 bench/gemma2.py --impls ours --clocks --order shuffle --rounds 9 --iters 40 \
      --json "$OUT/gemma2_d256_clocks.json"; tarup
  t g128_clk 200 python3 bench/gemma2.py --impls ours --clocks --order shuffle --rounds 9 --iters 40 --headdim 128 \
      --json "$OUT/gemma2_d128_clocks.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = all46 ]; then   # every GPU test file under the final defaults, in parallel processes
  # (the 188a9c3 run split the backward file in two, -k softcap / -k "not softcap"; all_gpu_tests runs it whole)
  pt asm tests/test_asm_gpu.py &
  pt pers tests/test_attn_fwd_persistent_gpu.py &
  pt knobs tests/test_attn_fwd_knobs_gpu.py &
  all_gpu_tests   # its wait also waits for the three above
  tarup; only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = ncu47 ]; then   # Nsight Compute under the final defaults: forward and backward, anchor and Gemma-2 D = 256
  ncu_k() {   # $1 kernel regex, $2 name, $3 launcher, rest: its args
    local k=$1 n=$2 py=$3; shift 3
    t "ncu_$n" 170 ncu --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --set full \
        --import-source no -f -o "$OUT/$n" python3 "$py" "$@"
    ncu -i "$OUT/$n.ncu-rep" --page raw --csv > "$OUT/${n}_raw.csv" 2>&1
    ncu -i "$OUT/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/${n}_sass.csv" 2>&1
    rm -f "$OUT/$n.ncu-rep"; gzip -f "$OUT/${n}_raw.csv" "$OUT/${n}_sass.csv"; tarup
  }
  G="--headdim 256 --seqlen 8192 --hq 8 --hkv 4"
  for b in softmax:native softcap:native softcap:poly sigmoid:native sigmoid:poly; do
    ncu_k AttnFwdSm90 "${b%%:*}_${b##*:}" bench/ncu_fwd.py --mode "${b%%:*}" --evaluator "${b##*:}"
  done
  for e in native poly; do ncu_k AttnFwdSm90 "g256_softcap_$e" bench/ncu_fwd.py --mode softcap --evaluator "$e" $G; done
  for b in softmax:native softcap:native softcap:poly; do
    ncu_k AttnBwdSm90 "bwd_${b%%:*}_${b##*:}" bench/ncu_bwd.py --mode "${b%%:*}" --evaluator "${b##*:}"
  done
  for e in native poly; do ncu_k AttnBwdSm90 "bwd_g256_softcap_$e" bench/ncu_bwd.py --mode softcap --evaluator "$e" $G; done
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = ncu28 ]; then   # Nsight Compute, one warm forward launch per build: pipe use, stalls, SASS-level samples
  ncu_one() {   # $1 name, rest: bench/ncu_fwd.py args
    local n=$1; shift
    t "ncu_$n" 150 ncu --kernel-name regex:AttnFwdSm90 --launch-skip 2 --launch-count 1 --set full \
        --import-source no -f -o "$OUT/$n" python3 bench/ncu_fwd.py "$@"
    ncu -i "$OUT/$n.ncu-rep" --page raw --csv > "$OUT/${n}_raw.csv" 2>&1
    ncu -i "$OUT/$n.ncu-rep" --page details --csv > "$OUT/${n}_details.csv" 2>&1
    ncu -i "$OUT/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/${n}_sass.csv" 2>&1
    rm -f "$OUT/$n.ncu-rep"; tarup
  }
  ncu_one softmax --mode softmax --evaluator native
  ncu_one softcap_native --mode softcap --evaluator native
  ncu_one softcap_native_pp --mode softcap --evaluator native --knob pingpong=1
  ncu_one softcap_poly --mode softcap --evaluator poly
  ncu_one sigmoid_native --mode sigmoid --evaluator native
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = warp27 ]; then   # is the score stage bound by what one warp per quadrant can issue?
  for w in 128 256 512; do
    t "rates_t$w" 120 python3 bench/issue_rates.py --threads "$w" --ctas-per-sm 1 \
        --ops tanh,ex2,tanh+ex2,fma.f32,fma.f16x2,tanh+fma.f16x2 --json "$OUT/issue_rates_t$w.json"; tarup
  done
  t cta_pers 240 python3 bench/cta_overhead.py --modes softmax:native,sigmoid:native,softcap:native \
      --knob persistent=0 --json "$OUT/cta_overhead_persistent.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = pers26 ]; then   # the GPU test files pers25 did not run (their forward calls are persistent now)
  pt bwd tests/test_attn_bwd_gpu.py &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  pt compile tests/test_compile_gpu.py &
  wait; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = pers25 ]; then   # the persistent forward as the default: forward-path GPU tests, then the timed tables
  pt fwd tests/test_attn_fwd_gpu.py &
  pt api tests/test_api_gpu.py &
  pt win tests/test_window_gpu.py &
  pt hf tests/test_transformers_gpu.py &
  wait; tarup
  t gqa_pairs 200 python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = pers24 ]; then   # persistent forward (AttnFwdConfig.persistent): tests, then timing beside the default
  pt pers tests/test_attn_fwd_persistent_gpu.py; tarup
  t pers_d128 200 python3 bench/fwd_tuning.py --seqlen 4096 --hq 32 --hkv 8 --headdim 128 --knob persistent=1 \
      --order shuffle --rounds 9 --modes softmax:native,softcap:native,softcap:poly,sigmoid:native,sigmoid:poly \
      --json "$OUT/fwd_persistent_d128.json"; tarup
  t pers_d256 150 python3 bench/fwd_tuning.py --knob persistent=1 --order shuffle --rounds 9 \
      --modes softmax:native,softcap:native,softcap:poly --json "$OUT/fwd_persistent_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = all23 ]; then   # eighth session: per-CTA fixed cost while the GPU is idle, then every GPU test file
  t cta 240 python3 bench/cta_overhead.py --json "$OUT/cta_overhead.json"; tarup
  all_gpu_tests; tarup
  pt asm tests/test_asm_gpu.py; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = mend22 ]; then   # after the review mend (alpha = (scale/c) / (2L) by one FMUL): odd_u2 and softcap GPU tests
  odd_tests
  softcap_tests 0
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final21 ]; then   # odd_u2 softcap default: deterministic, pre/post and torch.compile GPU tests, training sanity
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt prepost tests/test_attn_bwd_prepost_gpu.py &
  pt compile tests/test_compile_gpu.py &
  wait; tarup
  t train 150 python3 bench/train_sanity.py --json "$OUT/train_sanity.json" --md "$OUT/train_sanity.md"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final20 ]; then   # odd_u2 softcap default: softcap GPU tests (+ deterministic), issue rates per SM, goal pairs, Gemma-2 D = 256
  pt det_sc tests/test_attn_bwd_deterministic_gpu.py -k softcap &
  softcap_tests 1
  wait; tarup
  t rates 100 python3 bench/issue_rates.py --json "$OUT/issue_rates.json"; tarup
  t gqa_pairs 260 python3 bench/gqa_4096.py --pairs --pair-repeats 2 --json "$OUT/gqa_4096_pairs.json"; tarup
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = odd19 ]; then   # odd_u2 refit (6 coefficients) + cheaper backward MUFU columns: tests, poly_split, Gemma-2 D = 256 x2
  odd_tests
  t split_odd 240 python3 bench/poly_split.py --modes softcap --rounds 9 --only "softcap/softcap_c50_f16 1/16 softcap_grad=value,\
softcap/softcap_c50_f16_odd 1/16 softcap_grad=value,softcap/softcap_c50_f16_odd 1/8 softcap_grad=value,\
softcap/softcap_c50_f16_odd 1/4 softcap_grad=value" --json "$OUT/poly_split_odd.json"; tarup
  for r in 1 2; do
    t gemma2_d256_$r 150 python3 bench/gemma2.py --impls ours --programs softcap_c50_f16_odd --rounds 9 \
        --json "$OUT/gemma2_d256_odd_$r.json"; tarup
  done
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = odd18 ]; then   # the odd_u2 softcap program: its GPU tests, then poly_split (time + accuracy) and Gemma-2 D = 256
  odd_tests
  t split_odd 240 python3 bench/poly_split.py --modes softcap --rounds 9 --only "softcap/softcap_c50_f16 1/16 softcap_grad=value,\
softcap/softcap_c50_f16_odd 1/16 softcap_grad=value,softcap/softcap_c50_f16_odd 1/8 softcap_grad=value,\
softcap/softcap_c50_f16_odd 1/4 softcap_grad=value,softcap/softcap_c50_f16_odd 1/2 softcap_grad=value" \
      --json "$OUT/poly_split_odd.json"; tarup
  t gemma2_d256 150 python3 bench/gemma2.py --programs softcap_c50_f16_odd --json "$OUT/gemma2_d256_odd.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = rates17 ]; then   # issue rates of the stage's ops (F2FP, unpack, MUFU mixes), then elem16's steps
  t rates 150 python3 bench/issue_rates.py --json "$OUT/issue_rates.json"; tarup
  elem16_steps
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = shuf ]; then   # every gqa_4096 row, shuffled order, graph columns
  gqa_shuffle
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = acc ]; then   # forward normalisation knobs: GPU tests, accuracy (O, LSE), then timing
  pt fwd_knobs tests/test_attn_fwd_gpu.py -k "rsum or rescale_threshold"; tarup
  t knob_acc 150 python3 bench/fwd_knob_accuracy.py --json "$OUT/fwd_knob_accuracy.json"; tarup
  # softcap only (fixed_max_rsum needs the softcap stage); softmax's rescale_threshold: the lazy phase
  t rs128 120 python3 bench/fwd_tuning.py --headdim 128 --seqlen 4096 --hq 32 --hkv 8 --knob fixed_max_rsum=1 \
      --knob fixed_max=0 --knob fixed_max=0+rescale_threshold=8 --knob pingpong=1 --modes softcap:native,softcap:poly \
      --order shuffle --rounds 15 --iters 100 --json "$OUT/fwd_norm_knobs_d128.json"; tarup
  # pingpong=1: on for poly already (a null pair: the noise floor), new for native under fixed_max
  t rs256 150 python3 bench/fwd_tuning.py --knob fixed_max_rsum=1 --knob fixed_max=0 --knob fixed_max=0+rescale_threshold=8 --knob pingpong=1 \
      --modes softcap:native,softcap:poly --order shuffle --rounds 15 --iters 50 \
      --json "$OUT/fwd_norm_knobs_d256.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = partner ]; then   # does the pair partner's power set our clock? pairs with clocks, then with 200 ms idle per segment
  t pairs_clk 200 python3 bench/gqa_4096.py --pairs --pair-repeats 3 --clocks --json "$OUT/gqa_4096_pairs_clocks.json"; tarup
  t pairs_settle 260 python3 bench/gqa_4096.py --pairs --pair-repeats 3 --settle-ms 200 --clocks \
      --json "$OUT/gqa_4096_pairs_settle.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = pairs ]; then   # each goal pair timed alone (seed protocol on two rows), 5 repeats
  t gqa_pairs 400 python3 bench/gqa_4096.py --pairs --pair-repeats 5 --json "$OUT/gqa_4096_pairs.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fair ]; then   # neighbour (power) bias: ours + FA4 rows only; then every row shuffled, graph steps
  t gqa_pair 240 python3 bench/gqa_4096.py --impls ours,fa4 --clocks --json "$OUT/gqa_4096_ours_fa4.json"; tarup
  t gqa_shuf 300 python3 bench/gqa_4096.py --order shuffle --rounds 9 --clocks --graph-bwd \
      --json "$OUT/gqa_4096_shuffle.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = clk ]; then   # is the wall-clock backward slower than its device time because of the SM clock?
  t gqa_clk 420 python3 bench/gqa_4096.py --clocks --graph-bwd --json "$OUT/gqa_4096_clocks.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = zdq2 ]; then   # zero_dq timing on a clean GPU (nx3's run shared it with hung dq_tma probes), pre/post tests
  t zdq_time 200 python3 bench/attn_bwd_check.py --skip-check --variants --axes zero_dq \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_zero_dq.json"; tarup
  pt prepost tests/test_attn_bwd_prepost_gpu.py; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = zdq ]; then   # PreZeroKernel (zero_dq_in_pre): tests, then backward timing off vs on
  pt zdq tests/test_attn_bwd_prepost_gpu.py -k "zero_dq"; tarup
  t zdq_time 300 python3 bench/attn_bwd_check.py --skip-check --variants --axes zero_dq \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_zero_dq.json"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final8 ]; then   # Gemma-2 tables and the training sanity run under the current defaults
  t gemma2_d256 170 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"; tarup
  t train 150 python3 bench/train_sanity.py --json "$OUT/train_sanity.json" --md "$OUT/train_sanity.md"; tarup
  only_archive
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final6 ]; then   # accuracy (every mode, both programs) and the Gemma-2 D = 256 table
  t accuracy 150 python3 bench/accuracy.py --json "$OUT/accuracy.json"; tarup
  t gemma2_d256 240 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = bd ]; then   # per-kernel device time only (kernel_breakdown.py)
  t breakdown 170 python3 bench/kernel_breakdown.py --json "$OUT/kernel_breakdown.json"
elif [ "$phase" = hc ]; then   # eager autograd.Function path: API/compile tests, host cost, call timeline
  pt api tests/test_api_gpu.py &
  pt compile tests/test_compile_gpu.py &
  wait; tarup
  t host_cost 150 python3 bench/host_cost.py --json "$OUT/host_cost.json"; tarup
  t timeline 200 python3 bench/call_timeline.py --json "$OUT/call_timeline.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = hp ]; then   # FP16 API tests, then where the host time of a call goes
  pt api16 tests/test_api_gpu.py -k "fp16_inputs"; tarup
  t host_profile 200 python3 bench/host_profile.py --out "$OUT/host_profile"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = tl ]; then   # FP16 sigmoid/poly tests (kernel, API), then where bwd wall time goes
  pt sig16 tests/test_attn_bwd_gpu.py -k "fp16_inputs or sigmoid_bf16_program" &
  pt api16 tests/test_api_gpu.py -k "fp16_inputs" &
  wait; tarup
  t timeline 200 python3 bench/call_timeline.py --json "$OUT/call_timeline.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = fp16sig ]; then   # FP16-input sigmoid/poly (kernel level): its tests, then API ones
  pt sig16 tests/test_attn_bwd_gpu.py -k "fp16_inputs or sigmoid_bf16_program"
elif [ "$phase" = split ]; then   # program x poly split: fwd/bwd time and accuracy (bench/poly_split.py)
  t split 540 python3 bench/poly_split.py --json "$OUT/poly_split.json"
elif [ "$phase" = sgrad ]; then   # sigmoid poly backward sigma' rule: tests, timing, accuracy (tar after each step)
  pt sg_bwd tests/test_attn_bwd_gpu.py -k "split_reference and sigmoid"; tarup
  t sg_time 60 python3 bench/attn_bwd_check.py --skip-check --variants --axes sigmoid_grad --modes sigmoid \
      --json "$OUT/attn_bwd_sigmoid_grad.json"; tarup
  t sg_acc 60 python3 bench/accuracy.py --modes sigmoid --json "$OUT/accuracy_sigmoid.json"; tarup
  echo "== summary"; cat "$OUT/summary.txt"; exit 0
elif [ "$phase" = final ]; then   # after a default change: its tests, then the side-by-side tables
  pt bwd tests/test_attn_bwd_gpu.py &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt hf tests/test_transformers_gpu.py &
  pt compile tests/test_compile_gpu.py &
  wait
  t gqa 240 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
  t gemma2_d256 150 python3 bench/gemma2.py --json "$OUT/gemma2_d256.json"
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
elif [ "$phase" = mainloop ]; then   # backward mainloop v2 (default) vs v1: tests, then side-by-side timing
  pt bwd tests/test_attn_bwd_gpu.py &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt api tests/test_api_gpu.py &
  wait
  t ml_time 330 python3 bench/attn_bwd_check.py --skip-check --variants --axes mainloop \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_mainloop.json"
elif [ "$phase" = vdo ]; then   # V on the first dO barrier: tests, side-by-side timing, then gqa_4096
  pt vdo tests/test_attn_bwd_gpu.py -k "kv_barrier or v_with_do or mainloop_v1"
  t vdo_time 200 python3 bench/attn_bwd_check.py --skip-check --variants --axes v_with_do \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_v_with_do.json"
  t gqa 240 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
elif [ "$phase" = final4 ]; then   # after the v_with_do default: backward tests, its timing again, gqa_4096
  pt bwd tests/test_attn_bwd_gpu.py &
  pt det tests/test_attn_bwd_deterministic_gpu.py &
  pt api tests/test_api_gpu.py &
  pt win_b tests/test_window_gpu.py -k "not softmax and not softcap-native" &
  wait
  t vdo_time 150 python3 bench/attn_bwd_check.py --skip-check --variants --axes v_with_do \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_v_with_do.json"
  t gqa 240 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
elif [ "$phase" = breakdown ]; then   # per-kernel device time under the defaults, then Gemma-2 D = 128
  t breakdown 150 python3 bench/kernel_breakdown.py --json "$OUT/kernel_breakdown.json"
  t gemma2_d128 120 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
elif [ "$phase" = final2 ]; then   # short: forward tests under the defaults, then gqa_4096 (files left unpacked too)
  pt fwd tests/test_attn_fwd_gpu.py
  t gqa 240 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
elif [ "$phase" = lpt ]; then    # SectionLptScheduler CTA order: correctness, then forward and backward timings
  pt bwd_lpt tests/test_attn_bwd_gpu.py -k "lpt" &
  pt sched tests/test_tile_scheduler.py &
  wait
  t split_lpt 150 python3 tests/test_attn_fwd_split.py --out "$OUT/split" --only \
"softmax v2,softmax v2 lpt,softcap native v2,softcap native v2 lpt,sigmoid native v2,sigmoid native v2 lpt,\
softcap poly 1/2 v2 pp,softcap poly 1/2 v2 pp lpt,sigmoid poly 1/4 v2 pp,sigmoid poly 1/4 v2 pp lpt"
  t bwd_lpt_time 150 python3 bench/attn_bwd_check.py --skip-check --variants --axes lpt \
      --modes softmax,softcap,sigmoid --json "$OUT/attn_bwd_lpt.json"
else
  t split 200 python3 tests/test_attn_fwd_split.py --out "$OUT/split"
  t gqa 200 python3 bench/gqa_4096.py --graph --json "$OUT/gqa_4096.json"
  t prepost_time 60 python3 bench/attn_bwd_check.py --skip-check --prepost --modes softmax,sigmoid
  t elem_variants 90 python3 bench/elementwise_variants.py --json "$OUT/elementwise_variants.json"
  t gemma2_d128 90 python3 bench/gemma2.py --headdim 128 --json "$OUT/gemma2_d128.json"
fi
grep -h -E "^(FAILED|ERROR)" "$OUT"/*.log | head -20
echo "== summary"; cat "$OUT/summary.txt"
(cd "$OUT" && tar czf "/tmp/round_$phase.tgz" . && rm -rf "${OUT:?}"/* && mv "/tmp/round_$phase.tgz" "$OUT/")
