#!/usr/bin/env bash
# The shipped H200 heuristics (cutetune/data/heuristics_sm90_bf16.json.gz) from the shipped cost
# model and the inputs under data/inputs/: the measured dataset, Inductor's Triton sweep and its
# retimes, the step reports whose host times the launch costs hedge over, and the SwiGLU
# benchmarks. Then the fp16 file (heuristics_sm90_fp16.json.gz, OUT16) from the fp16 model and
# dataset alone: nothing Triton or SwiGLU was measured in fp16. Then the H100's own files
# (h100_sxm/heuristics_sm90_{bf16,fp16}.json.gz, OUT100 and beside it) from its models and
# datasets: on an H100 they answer which config or cuBLAS, the H200's files the rest
# (PackagedHeuristics). data/inputs/ holds exactly what this script and
# scripts/train_cost_model.py read (tests/test_data_layout.py checks it). Any CPU host (about
# 11 min on 2 cores); OUT defaults to the shipped file, OUT16 and OUT100 to its folder's.
# docs/reproduce.md lists what made each input.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-cutetune/data/heuristics_sm90_bf16.json.gz}
OUT16=${2:-$(dirname "$OUT")/heuristics_sm90_fp16.json.gz}
OUT100=${3:-$(dirname "$OUT")/h100_sxm/heuristics_sm90_bf16.json.gz}
I=data/inputs
S=$I/steps
cutetune emit --model cutetune/data/cost_model_sm90_bf16.json.gz --dataset $I/h200_bf16 \
  --triton-sweep $I/triton_mm/h200_bf16.jsonl.gz \
  --triton-retimed $I/triton_mm/h200_bf16_retimed_top4.jsonl \
    $I/triton_mm/h200_bf16_retimed_exh.jsonl \
  --triton-steps $S/step_h200_bounded.json $S/step_h200_bounded2.json \
    $S/step_h200_bounded3.json $S/step_h200_bounded4.json $S/step_h200_gate.json \
    $S/step_h200_gate_predicted.json $S/step_h200_hostcal.json $S/step_h200_mixed.json \
    $S/step_h200_mixed2.json $S/step_h200_mixed3.json $S/step_h200_recheck.json \
    $S/step_h200_recheck2.json $S/step_h200_recheck3.json $S/step_h200_tuned.json \
    $S/step_h200_tuned2.json $S/step_h200_tuned3.json $S/step_h200_tuned4.json \
    $S/step_h200_allsteps.json $S/step_h200_allsteps2.json $S/step_h200_allsteps3.json \
    $S/step_h200_tcache.json \
  --swiglu-bench $I/swiglu/swiglu_h200.json $I/swiglu/swiglu_families_h200.json \
    $I/swiglu/swiglu_small_h200.json \
  --out "$OUT"
cutetune emit --model cutetune/data/cost_model_sm90_fp16.json.gz --dtype fp16 --dataset $I/h200_fp16 \
  --out "$OUT16"
cutetune emit --model cutetune/data/h100_sxm/cost_model_sm90_bf16.json.gz --dataset $I/h100_bf16 \
  --out "$OUT100"
cutetune emit --model cutetune/data/h100_sxm/cost_model_sm90_fp16.json.gz --dtype fp16 \
  --dataset $I/h100_fp16 --out "$(dirname "$OUT100")/heuristics_sm90_fp16.json.gz"
