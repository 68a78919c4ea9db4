#!/usr/bin/env bash
# The device round: GPU tests and the benchmarks of the current defaults, one phase or several
# per device call (each phase fits one 600 s call on the H200).
#
#   source .payload/setup.sh || exit 3; export FAP_COMMIT=<sha>; source bench/device_env.sh || exit 4
#   bash bench/round.sh PHASE [PHASE...]
#
# (FAP_COMMIT as a literal sha: the copied tree has no .git; bench/protocol.commit_id records it.)
# Phases:
#   tests        every GPU test file (the files that use pytest.mark.gpu), one process each, in parallel
#                (TEST_FILES="tests/test_a.py ...": those files only; TEST_K="expr": pytest -k expr in each;
#                ROUND_DEADLINE_S=n: every file stops n - 20 s after the round started, so a call that runs
#                other steps first still gets the logs and the tarball back inside its 600 s)
#                (but the correctness and fuzz tiers: phase correctness)
#   goals        bench/gqa_4096.py --pairs: the issues' goal pairs, each pair timed alone, 2 repeats
#                (PAIR_NAMES="a,b": those pairs only; PAIR_REPEATS=n)
#   table        bench/gqa_4096.py: every row side by side, shuffled order, CUDA-graph and clock columns;
#                then bench/gemma2.py at D = 256 and D = 128 (ours + FA4 rows, the FP16 tanh program as a row)
#   accuracy     bench/accuracy.py: output and gradient error vs FP64, every mode and evaluator
#   elementwise  bench/elementwise.py, CUDA-graph device time, then eager
#   ncu          Nsight Compute of one warm launch per default build (forward and backward, anchor
#                and Gemma-2 D = 256), summarised by bench/tools/ncu_summary.py (samples before / in /
#                after the main loop included); NCU_BUILDS="name@kernel regex@launcher args;..." profiles
#                those instead (ours, FA4's or cuDNN's kernels, e.g. "bwd_d64_fa4@BackwardSm90@bench/tools/
#                ncu_bwd.py --impl fa4 --hq 32 --hkv 32 --headdim 64 --batch 2 --seqlen 8192"; a name starting
#                with bwd_ is a backward build)
#   first_call   bench/tools/first_call.py: import + first call per mode, cold and warm compile cache
#   train_model  bench/train_model.py (issue 29): Gemma-2-2B at S = 4096 through transformers, arms flex, ours
#                native, ours poly, 100 compiled training steps each, alternating in one process (~7-8 min, stops
#                starting segments at 470 s); TRAIN_MODEL_ARGS="--model gemma2-2b --seqlen 8192 --arms flex,native,poly"
#                (or --model llama3-8b --arms sdpa,native,poly, llama3-8b-sigmoid, ...) runs another subset;
#                it replaces the tiny-decoder phase (bench/tools/train_sanity.py, 200 steps, every arm: run it
#                by hand, ~300 s) to keep 10 phases
#   sweep        bench/sweep.py --quick: issue 27's grid against FA4, cuDNN and Flex, its quick subset
#                (S 1k and 4k, D 128, causal, GQA, every mode; ~4 min); SWEEP_CELLS=GLOBS runs those
#                cells of the full grid instead (bench/sweep.py --dry-run --cells GLOBS lists them),
#                stopping before 520 s; `bench/sweep.py --merge` joins the JSONs of several calls;
#                SWEEP_GROUP=N times N consecutive cells per process (--cells-per-process)
#   correctness  the catalogue and fuzz tiers (tests/test_correctness_gpu.py, tests/test_fuzz_gpu.py) in
#                $FAP_SHARDS (default 12) parallel shards split by kernel variant, then bench/correctness.py
#                collect: correctness.json + .md (cases per tier, max error ratio to torch per mode and
#                direction, the worst case) and the shards' JSON lines
#                (compute-sanitizer is not a phase: run bench/tools/sanitize.py after this phase in the same
#                call, so its kernels load from the disk cache; it writes to $OUT too)
# Outputs: each step's log, results JSON + Markdown and summary.txt are written to
# $OUT/round_<phases>/ ($OUT: the device tool's folder; default bench/out), which at the end
# becomes $OUT/round_<phases>.tgz; summary.txt and (when there are few) the Markdown tables are
# also copied beside it, since the device tool returns at most 8 files. Copy a table into
# bench/results/ to commit it.
set -u
PHASES="tests goals table accuracy elementwise ncu first_call train_model sweep correctness"
[ $# -ge 1 ] || { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2; }
for phase in "$@"; do
  case " $PHASES " in *" $phase "*) ;; *) echo "unknown phase $phase (phases: $PHASES)"; exit 2 ;; esac
done
cd "$(dirname "$0")/.." || exit 2
name=round_$(IFS=_; echo "$*")
OUT=${OUT:-bench/out}; W="$OUT/$name"; rm -rf "$W"; mkdir -p "$W" || exit 2; S=$SECONDS
echo "$name at commit ${FAP_COMMIT:-(FAP_COMMIT unset: bench/protocol.commit_id decides)}" | tee -a "$W/summary.txt"

t() {   # t NAME SECONDS CMD...: run under a timeout, log to $W/NAME.log, one summary line
  local n=$1 s=$2; shift 2
  timeout "$s" "$@" > "$W/$n.log" 2>&1
  echo "$n rc=$? t=$((SECONDS - S))s $(tail -n 1 "$W/$n.log" | cut -c1-120)" >> "$W/summary.txt"
}
pt() {   # a test file under 500 s, or what is left of ROUND_DEADLINE_S (seconds from the round's start) less 20 s
  local n=$1 s=500; shift
  if [ -n "${ROUND_DEADLINE_S:-}" ]; then
    local left=$((ROUND_DEADLINE_S - (SECONDS - S) - 20))
    [ "$left" -lt "$s" ] && s=$left
    [ "$s" -lt 1 ] && { echo "$n not started: ROUND_DEADLINE_S passed" >> "$W/summary.txt"; return; }
  fi
  t "$n" "$s" python3 -m pytest -q -p no:cacheprovider -m gpu ${TEST_K:+-k "$TEST_K"} "$@"
}

# the correctness and fuzz tiers run sharded in their own phase (one process would compile all 36 variants)
gpu_test_files() { grep -l "pytest.mark.gpu" tests/test_*.py | grep -v -e test_correctness_gpu.py -e test_fuzz_gpu.py; }

phase_tests() {   # compile is CPU-bound: every file in its own process; the window file in two halves
  local f n
  for f in ${TEST_FILES:-$(gpu_test_files)}; do
    n=$(basename "$f" .py); n=${n#test_}
    if [ "$n" = window_gpu ]; then
      pt window_gpu_a "$f" -k "softmax or softcap-native" &
      pt window_gpu_b "$f" -k "not softmax and not softcap-native" &
    else
      pt "$n" "$f" &
    fi
  done
  wait
}

phase_correctness() {   # shards split by kernel variant: each build compiles in one process
  local n=${FAP_SHARDS:-12} i d="$W/correctness"
  mkdir -p "$d"
  for i in $(seq 0 $((n - 1))); do
    t "correctness_$i" 540 env FAP_SHARD="$i/$n" FAP_CORRECTNESS_OUT="$d" python3 -m pytest -q -p no:cacheprovider \
        -m gpu tests/test_correctness_gpu.py tests/test_fuzz_gpu.py &
  done
  wait
  t correctness_collect 60 python3 bench/correctness.py collect "$d" --json "$W/correctness.json"
  cp "$W/correctness.json" "$OUT/" 2>/dev/null   # beside the tarball: the table to commit
}

phase_ncu() {   # one warm launch per build under ncu --set full; raw and SASS pages as CSV
  local d="$W/ncu"; mkdir -p "$d"
  ncu_k() {   # $1 kernel regex, $2 build name, $3 launcher, rest: its args
    local k=$1 n=$2 py=$3; shift 3
    t "ncu_$n" 170 ncu --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --set full \
        --import-source no -f -o "$d/$n" python3 "$py" "$@"
    ncu -i "$d/$n.ncu-rep" --page raw --csv > "$d/${n}_raw.csv" 2>&1
    ncu -i "$d/$n.ncu-rep" --page source --csv --print-source sass > "$d/${n}_sass.csv" 2>&1
    rm -f "$d/$n.ncu-rep"; gzip -f "$d/${n}_raw.csv" "$d/${n}_sass.csv"
  }
  local G="--headdim 256 --seqlen 8192 --hq 8 --hkv 4" b e n k a
  if [ -n "${NCU_BUILDS:-}" ]; then
    while IFS='@' read -r n k a; do
      [ -n "$n" ] && ncu_k "$k" "$n" ${a}   # word splitting of the launcher and its arguments intended
    done < <(printf '%s\n' "$NCU_BUILDS" | tr ';' '\n')
    t ncu_summary 60 python3 bench/tools/ncu_summary.py "$d" --json "$W/attn_ncu.json" --note "NCU_BUILDS: $NCU_BUILDS"
    cp "$W/attn_ncu.md" "$OUT/" 2>/dev/null
    return
  fi
  for b in softmax:native softcap:native softcap:poly sigmoid:native sigmoid:poly; do
    ncu_k AttnFwdSm90 "${b%%:*}_${b##*:}" bench/tools/ncu_fwd.py --mode "${b%%:*}" --evaluator "${b##*:}"
  done
  for e in native poly; do ncu_k AttnFwdSm90 "g256_softcap_$e" bench/tools/ncu_fwd.py --mode softcap --evaluator "$e" $G; done
  for b in softmax:native softcap:native softcap:poly; do
    ncu_k AttnBwdSm90 "bwd_${b%%:*}_${b##*:}" bench/tools/ncu_bwd.py --mode "${b%%:*}" --evaluator "${b##*:}"
  done
  for e in native poly; do ncu_k AttnBwdSm90 "bwd_g256_softcap_$e" bench/tools/ncu_bwd.py --mode softcap --evaluator "$e" $G; done
  t ncu_summary 60 python3 bench/tools/ncu_summary.py "$d" --json "$W/attn_ncu.json"
}

for phase in "$@"; do
  case $phase in
    tests)       phase_tests ;;
    goals)       t goals 400 python3 bench/gqa_4096.py --pairs --pair-repeats "${PAIR_REPEATS:-2}" \
                     ${PAIR_NAMES:+--pair-names "$PAIR_NAMES"} --json "$W/gqa_4096_pairs.json" ;;
    table)       t table 400 python3 bench/gqa_4096.py --order shuffle --rounds 9 --clocks --graph-bwd \
                     --json "$W/gqa_4096_shuffle.json"
                 t gemma2_d256 260 python3 bench/gemma2.py --impls ours,fa4 --programs softcap_c50_f16_odd \
                     --json "$W/gemma2_d256.json"
                 t gemma2_d128 220 python3 bench/gemma2.py --impls ours,fa4 --programs softcap_c50_f16_odd \
                     --headdim 128 --json "$W/gemma2_d128.json" ;;
    accuracy)    t accuracy 300 python3 bench/accuracy.py --json "$W/accuracy.json" ;;
    elementwise) t elementwise_graph 250 python3 bench/elementwise.py --graph --json "$W/elementwise_graph.json"
                 t elementwise 250 python3 bench/elementwise.py --json "$W/elementwise.json" ;;
    ncu)         phase_ncu ;;
    first_call)  if [ -f bench/tools/first_call.py ]; then
                   # as on an installed machine: Python caches bytecode (the device image sets
                   # PYTHONDONTWRITEBYTECODE, so every process would compile torch's and cutlass's
                   # sources again: seconds per import); one warm-up import fills the cache
                   ( unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/fap_pyc
                     python3 -c "import torch, cutlass.cute, flash_attn_poly, torch.fx.experimental.symbolic_shapes"
                     t first_call 500 python3 bench/tools/first_call.py --json "$W/first_call.json" )
                 else
                   echo "first_call: bench/tools/first_call.py is not in this tree" >> "$W/summary.txt"
                 fi ;;
    train_model) t train_model 560 python3 bench/train_model.py \
                     ${TRAIN_MODEL_ARGS:---model gemma2-2b --seqlen 4096 --arms flex,native,poly} \
                     --profile-steps 3 --budget-s 470 --json "$W/train_model.json" ;;
    sweep)       sw=(--quick); [ -n "${SWEEP_CELLS:-}" ] && sw=(--cells "$SWEEP_CELLS")
                 [ -n "${SWEEP_GROUP:-}" ] && sw+=(--cells-per-process "$SWEEP_GROUP")
                 t sweep 560 python3 bench/sweep.py "${sw[@]}" --budget-s 520 --json "$W/sweep.json"
                 png=$(find "$W" -maxdepth 1 -name "sweep_*.png")   # the quick run's 3 come back as files
                 [ -n "$png" ] && [ "$(echo "$png" | wc -l)" -le 3 ] && cp $png "$OUT/" ;;
    correctness) phase_correctness ;;
  esac
done

grep -h -E "^(FAILED|ERROR)" "$W"/*.log 2>/dev/null | head -20
echo "== summary"; cat "$W/summary.txt"
tar czf "$OUT/$name.tgz" -C "$OUT" "$name" && cp "$W/summary.txt" "$OUT/${name}_summary.txt"
md=$(find "$W" -maxdepth 1 -name "*.md")
[ -n "$md" ] && [ "$(echo "$md" | wc -l)" -le 6 ] && cp $md "$OUT/"
rm -rf "$W"
