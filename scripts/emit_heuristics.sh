#!/usr/bin/env bash
# The shipped H200 heuristics (cutetune/data/heuristics_sm90_bf16.json) from the committed
# model, dataset, Triton sweeps and retimes, step reports and SwiGLU benchmarks: the one
# command the README's reproduce table runs (and the H200 sessions ran, in
# scripts/h200_session.sh: docs/reproduce_removed.md). Any CPU host (about 3 min on 2 cores).
# OUT defaults to the shipped file.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-cutetune/data/heuristics_sm90_bf16.json}
B=data/bench
cutetune emit --model cutetune/data/cost_model_sm90_bf16.json --dataset data/h200_bf16 \
  --triton-sweep data/triton_mm/h200_bf16.jsonl.gz \
  --triton-retimed data/triton_mm/h200_bf16_retimed_top4.jsonl \
    data/triton_mm/h200_bf16_retimed_exh.jsonl \
  --triton-steps $B/step_h200_bounded.json $B/step_h200_bounded2.json \
    $B/step_h200_bounded3.json $B/step_h200_bounded4.json $B/step_h200_gate.json \
    $B/step_h200_gate_predicted.json $B/step_h200_hostcal.json $B/step_h200_mixed.json \
    $B/step_h200_mixed2.json $B/step_h200_mixed3.json $B/step_h200_recheck.json \
    $B/step_h200_recheck2.json $B/step_h200_recheck3.json $B/step_h200_tuned.json \
    $B/step_h200_tuned2.json $B/step_h200_tuned3.json $B/step_h200_tuned4.json \
    $B/step_h200_allsteps.json $B/step_h200_allsteps2.json $B/step_h200_allsteps3.json \
    $B/step_h200_tcache.json \
  --swiglu-bench $B/swiglu_h200.json $B/swiglu_families_h200.json $B/swiglu_small_h200.json \
  --out "$OUT"
