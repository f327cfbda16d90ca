#!/usr/bin/env bash
# Runs on the GPU host (through the device tool), from the repo root, after the dependency
# bundle is unpacked (docs/reproduce.md). Stages, in order given:
#   tests       GPU tests of the harness            -> $OUT/gpu_tests.log
#   train       sampled configs on the train suite  -> dataset, until the deadline
#   exhaustive  every valid config on 40 problems   -> dataset, until the deadline
#   repeat      a fixed set measured again          -> second dataset (timing-noise report);
#               $REPEAT_N of the train suite's problems ($REPEAT_LAYOUTS their layouts, say mn),
#               $REPEAT_CONFIGS (the spec the dataset drew those problems with, say
#               sample:150@300: another spec draws other configs, and only shared ones compare)
#   layouts     the train suite's layers' GEMMs in the kn, mk and mn layouts (kn their input
#               gradients, mn their weight gradients; $LAYOUTS, say kk, for others), sampled
#               configs -> dataset h200_bf16 (each dense stage: h100_* on an H100, below)
#               (each data stage runs until the deadline: one a call; layouts, bmm and fp16
#               draw each problem's 150 from 300 kernels per layout and dtype, sample:150@300,
#               so that a fresh machine compiles about 880 kernels, not 3500, before the GPU
#               measures at its own pace: data/reports/config_pool_compile_plan.json)
#   layouts_exhaustive  the exhaustive suite ($EXH_PROBLEMS another: it holds 18 problems valid
#               in mk) in those layouts ($EXH_LAYOUTS, default all three: each layout compiles
#               its own kernels), every config -> h200_bf16
#               (layouts, fp16_layouts and layouts_exhaustive: $LIMIT, say 170, keeps the suite's
#               first problems, so that a call can finish a layout's quota before the next)
#   bmm         the bmm suite (attention's batched GEMMs), sampled configs -> h200_bf16
#   fp16        the train suite in fp16, sampled configs -> dataset h200_fp16
#   fp16_layouts  the same in the kn, mk and mn layouts ($LAYOUTS for others) -> h200_fp16
#   unseen      random shapes no shipped model trained on (the random suite drawn with seed
#               $UNSEEN_SEED, default 7; the train suite's are seed 0's), its first $LIMIT
#               (default 40) in kk, kn, mk and mn, sampled configs -> h200_bf16_unseen;
#               scripts/score_models.py scores models on it
#   gpu_tests   every test marked gpu               -> $OUT/gpu_tests_all.log
#   grouped_tests  the grouped harness's GPU tests  -> $OUT/gpu_tests_grouped.log
#   grouped_fwd    MoE forward GEMMs: every config of the cheaper ones
#   grouped_rest   a sample of the configs of the dearer forward GEMMs and of the input and
#                  weight gradients' GEMMs
#   grouped_grads  a sample of the configs of the cheaper input and weight gradients' GEMMs
#   grouped_routings  the MoE suite's GEMMs under a balanced and a skewed routing each (each
#                  had one drawn routing): a sample of 48 configs
#                  (grouped: -> the dataset h200_bf16_grouped, resumed from the committed one;
#                  scripts/grouped_plan.py splits)
#   moe_large      the MoE models' expert GEMMs above the moe suite's FLOP cap (to 65536
#                  tokens), cheapest first: a sample of 24 configs, for up to $MOE_LARGE_S
#                  (default: the call) seconds
#   grouped_mm_tests  cutetune.grouped_mm's GPU tests and the harness's -> $OUT/gpu_tests_grouped_mm.log
#   moe_bench      scripts/bench_moe.py run: the MoE block in every mode, then its GEMMs
#                  -> $OUT/moe_block_h200.json (and .png where matplotlib is), $OUT/moe_gemms_h200.json
#   moe_gather     scripts/bench_moe.py gather: the up projection with quack's gather (A_idx)
#                  against the permutation's copy -> $OUT/moe_gather_h200.json
#   compile_ab     scripts/compile_time_ab.py: the compile helper against quack's compile pool
#                  -> $OUT/compile_time_ab_h200.json
#   train_step     scripts/bench_train_step.py: a 2-layer Llama-3-8B training step at M=4096 in
#                  default, predicted and reduced mode -> $OUT/train_step_<gpu>.json.gz
#   cudagraphs     scripts/bench_cudagraphs.py: small M with and without CUDA graphs
#                  -> $OUT/cudagraphs_small_m_h200.json.gz; resumes from the checkout's
#                  data/bench/cudagraphs_small_m_h200.json.gz where there is one (an earlier
#                  call's, copied there), so that the M grid can span calls; the Ms in
#                  $CG_RERUN (say "1") are timed again
# Data and quack's kernel cache live under /tmp so they survive between calls on one warm
# machine; each stage ends by packing the dataset into $OUT. The dense stages write the GPU's
# own datasets: on an H100 h100_bf16 and h100_fp16 in place of h200_*, resumed from the
# checkout's data/inputs/ (or data/bench/) copy (a model learns one device's times: the H100
# has models of its own, docs/results.md).
set -uo pipefail
DEADLINE=$(( $(date +%s) + ${CUTETUNE_CALL_S:-560} ))
ROOT=${CUTETUNE_DATA:-/tmp/cutetune-data}
export QUACK_CACHE_DIR=/tmp/quack-cache PYTHONUNBUFFERED=1
mkdir -p "$ROOT" "$QUACK_CACHE_DIR" "$OUT"
left() { echo $(( DEADLINE - $(date +%s) - ${1:-40} )); }
pack() { tar -C "$ROOT" -czf "$OUT/datasets.tgz" . ; ls -la "$OUT"; }
# h200 or h100 (B200: b200): the dense datasets' prefix
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -oE '[HB][0-9]+' | head -n 1 | tr HB hb)
BF16=${GPU:-h200}_bf16 FP16=${GPU:-h200}_fp16
# Resume from the committed dataset when this machine has none yet.
resume() { [ -d "$ROOT/$1" ] && return; for d in data/inputs/$1 data/bench/$1; do
  [ -d "$d" ] && { cp -r "$d" "$ROOT/"; return; }; done; }
case " $* " in *" train "*|*" exhaustive "*|*" layouts"*|*" bmm "*) resume $BF16 ;; esac
case " $* " in *" fp16"*) resume $FP16 ;; esac
case " $* " in *" unseen "*) resume ${BF16}_unseen ;; esac
PLAN=/tmp/grouped-plan
# the grouped dataset, resumed from the committed one where this machine has none yet
grouped_data() { [ -d "$ROOT/h200_bf16_grouped" ] || cp -r data/inputs/h200_bf16_grouped "$ROOT/"; }
grouped() {  # grouped PROBLEMS-FILE CONFIGS BUDGET-S NAME
  [ -f "$PLAN/$1" ] || python scripts/grouped_plan.py --out "$PLAN" > /dev/null
  grouped_data
  python -m cutetune collect --problems "$PLAN/$1" --configs "$2" --out "$ROOT/h200_bf16_grouped" \
    --time-budget "$3" --stats "$OUT/collect_$4_stats.json" 2>&1 | tail -n 4
}
# Seconds reserved for the stages after train, so that a long train stage cannot starve them.
AFTER_TRAIN=${CUTETUNE_AFTER_TRAIN_S:-330}
for stage in "$@"; do
  echo "=== stage $stage, $(left 0) s left"
  case $stage in
    tests)
      python -m pytest -m gpu ${GPU_TESTS:-tests/test_gpu_harness.py} -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" \
        || { echo "GPU tests failed: stopping before collection"; exit 1; } ;;
    train)
      python -m cutetune collect --problems train --configs sample:150 --out "$ROOT/$BF16" \
        --time-budget "$(left $AFTER_TRAIN)" --stats "$OUT/collect_train_stats.json" 2>&1 | tail -n 30 ;;
    layouts)
      python -m cutetune collect --problems train --layouts "${LAYOUTS:-kn,mk,mn}" --configs sample:150@300 \
        ${LIMIT:+--limit-problems "$LIMIT"} --out "$ROOT/$BF16" --time-budget "$(left 30)" \
        --stats "$OUT/collect_layouts_stats.json" 2>&1 | tail -n 5 ;;
    layouts_exhaustive)
      python -m cutetune collect --problems "${EXH_PROBLEMS:-exhaustive}" --layouts "${EXH_LAYOUTS:-kn,mk,mn}" \
        --configs all --target-ms 1 \
        ${LIMIT:+--limit-problems "$LIMIT"} --out "$ROOT/$BF16" --time-budget "$(left 30)" \
        --stats "$OUT/collect_layouts_exh_stats.json" 2>&1 | tail -n 5 ;;
    bmm)
      python -m cutetune collect --problems bmm --configs sample:150@300 \
        --out "$ROOT/$BF16" --time-budget "$(left 30)" --stats "$OUT/collect_bmm_stats.json" 2>&1 | tail -n 5 ;;
    fp16)
      python -m cutetune collect --problems train --dtype fp16 --configs sample:150@300 \
        --out "$ROOT/$FP16" --time-budget "$(left 30)" --stats "$OUT/collect_fp16_stats.json" 2>&1 | tail -n 5 ;;
    fp16_layouts)
      python -m cutetune collect --problems train --dtype fp16 --layouts "${LAYOUTS:-kn,mk,mn}" \
        --configs sample:150@300 ${LIMIT:+--limit-problems "$LIMIT"} --out "$ROOT/$FP16" \
        --time-budget "$(left 30)" --stats "$OUT/collect_fp16_layouts_stats.json" 2>&1 | tail -n 5 ;;
    unseen)
      python -m cutetune collect --problems random --seed "${UNSEEN_SEED:-7}" --layouts kk,kn,mk,mn \
        --limit-problems "${LIMIT:-40}" --configs sample:150@300 --out "$ROOT/${BF16}_unseen" \
        --time-budget "$(left 30)" --stats "$OUT/collect_unseen_stats.json" 2>&1 | tail -n 5 ;;
    exhaustive)
      python -m cutetune collect --problems exhaustive --configs all --target-ms 1 --out "$ROOT/$BF16" \
        --time-budget "$(left 90)" --stats "$OUT/collect_exhaustive_stats.json" 2>&1 | tail -n 30 ;;
    gpu_tests)
      python -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_all.log" | tail -n 15 ;;
    grouped_tests)
      python -m pytest -m gpu tests/test_grouped_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_grouped.log" | tail -n 25 ;;
    grouped_fwd)
      grouped exhaustive_fwd.json all "$(left 30)" fwd_exhaustive ;;
    grouped_rest)
      grouped sampled_fwd.json sample:48 "$(( $(left 30) / 2 ))" fwd_sampled
      grouped sampled_dgrad.json sample:32 "$(( $(left 30) / 2 ))" dgrad_sampled
      grouped sampled_wgrad.json sample:32 "$(left 30)" wgrad_sampled ;;
    grouped_routings)
      grouped_data
      python -m cutetune collect --problems moe --configs sample:48 --routings balanced,skewed \
        --out "$ROOT/h200_bf16_grouped" --time-budget "$(left 30)" \
        --stats "$OUT/collect_routings_stats.json" 2>&1 | tail -n 4 ;;
    grouped_grads)
      grouped exhaustive_dgrad.json sample:32 "$(( $(left 30) / 2 ))" dgrad_cheap
      grouped exhaustive_wgrad.json sample:32 "$(left 30)" wgrad_cheap ;;
    moe_large)
      grouped_data
      python -m cutetune collect --problems moe_large --configs sample:24 \
        --out "$ROOT/h200_bf16_grouped" --time-budget "${MOE_LARGE_S:-$(left 30)}" \
        --stats "$OUT/collect_moe_large_stats.json" 2>&1 | tail -n 4 ;;
    grouped_mm_tests)
      python -m pytest -m gpu tests/test_grouped_mm_gpu.py tests/test_grouped_gpu.py -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_tests_grouped_mm.log" | tail -n 25 ;;
    moe_bench)
      python scripts/bench_moe.py run --out "$OUT" --budget-s "$(left 20)" 2>&1 | tail -n 60 ;;
    moe_gather)
      python scripts/bench_moe.py gather --out "$OUT/moe_gather_h200.json" --budget-s "$(left 20)" \
        2>&1 | tail -n 12 ;;
    compile_ab)
      python scripts/compile_time_ab.py --repeats 2 --variants helper quack_pool \
        --out "$OUT/compile_time_ab_h200.json" 2>&1 | tail -n 15 ;;
    train_step)
      python scripts/bench_train_step.py --out "$OUT/train_step_${GPU:-gpu}.json.gz" 2>&1 | tail -n 60 ;;
    cudagraphs)
      CG=data/bench/cudagraphs_small_m_h200.json.gz
      python scripts/bench_cudagraphs.py --out "$OUT/cudagraphs_small_m_h200.json.gz" \
        --budget-s "$(left 60)" $([ -f $CG ] && echo --resume $CG) \
        $([ -n "${CG_RERUN:-}" ] && echo --rerun $CG_RERUN) 2>&1 | tail -n 30 ;;
    repeat)
      python -m cutetune collect --problems train --configs "${REPEAT_CONFIGS:-sample:20}" \
        --limit-problems "${REPEAT_N:-30}" ${REPEAT_LAYOUTS:+--layouts "$REPEAT_LAYOUTS"} \
        --out "$ROOT/${BF16}_repeat" --time-budget "$(left 30)" \
        --stats "$OUT/collect_repeat_stats.json" 2>&1 | tail -n 5 ;;
  esac
  pack > /dev/null
done
pack
