#!/usr/bin/env bash
# The GPU calls of one device session on nvidia-h200-x2 (2 H200s, 32 cores), from the repo root
# after `source .gpu/2/unpack.sh`. Independent work runs side by side, one GPU and half the
# cores each (taskset 0-15 / 16-31, like the 16-core single-H200 host), so no timing shares a
# GPU or a core with another job. State lives under /tmp between calls on one warm machine.
#   call2  GPU0: collection (scripts/gpu_collect.sh)
#          GPU1: GPU tests of the launcher and Inductor, then the torch.compile benchmark
#                (scripts/bench_e2e.py) at M 1 16 128
#   call3  GPU0: rest of the collection, the harness's GPU tests, then the benchmark at M 1024
#          GPU1: model-guided tuning of unseen problems (scripts/tune_gpu_bench.py), then M 4096
#   call4  GPU0/GPU1: benchmark M values still missing; then the fleet throughput on both
#          (scripts/fleet_throughput.sh one two report; the kernel cache is warm from call2)
#   e2e    (a later session, after kernel prefetch in reduced mode) GPU0: the GPU tests of the
#          Inductor integration, then the benchmark from small M up; GPU1: from large M down;
#          every M with cold and warm kernel caches for both cutetune modes
# Each call's results are packed into $OUT (at most 8 files come back).
set -uo pipefail
DEADLINE=$(( $(date +%s) + ${CUTETUNE_CALL_S:-560} ))
left() { echo $(( DEADLINE - $(date +%s) - ${1:-0} )); }
E2E=/tmp/e2e TUNE=/tmp/tune RESERVE=0  # RESERVE: seconds the benchmark leaves to later steps
WARM_FOR=${CUTETUNE_E2E_WARM_FOR:-predicted}  # cutetune modes also run with warm kernel caches
export PYTHONUNBUFFERED=1 QUACK_CACHE_DIR=/tmp/quack-cache PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$E2E" "$TUNE" "$OUT"
on() {  # on GPU CMD...: run CMD on one GPU and its half of the cores
  local gpu=$1; shift
  command -v taskset > /dev/null || { CUDA_VISIBLE_DEVICES=$gpu "$@"; return; }
  CUDA_VISIBLE_DEVICES=$gpu taskset -c "$([ "$gpu" = 0 ] && echo 0-15 || echo 16-31)" "$@"
}
e2e_done() {  # an M is done when its part holds no skipped or failed run
  [ -s "$E2E/part_m$1.json" ] && python - "$E2E/part_m$1.json" <<'EOF'
import json, sys
sys.exit(any(r["status"] != "ok" for r in json.load(open(sys.argv[1]))["runs"]))
EOF
}
e2e() {  # e2e GPU M...: the benchmark for each M not done yet, each its own part
  local gpu=$1; shift
  for m in "$@"; do
    e2e_done "$m" && continue
    mkdir "$E2E/claim_${CALL}_m$m" 2>/dev/null || continue  # the other GPU has it
    [ "$(left $((60 + RESERVE)))" -gt 0 ] || { echo "no time for M=$m"; continue; }
    # shellcheck disable=SC2086
    on "$gpu" python scripts/bench_e2e.py --ms "$m" --warm-for $WARM_FOR \
      --budget-s "$(left $((20 + RESERVE)))" $([ "$m" = 1 ] || echo --skip-overhead) \
      --out "$E2E/part_m$m.json" >> "$E2E/e2e.log" 2>&1
  done
}
collect() { on 0 env CUTETUNE_CALL_S="$(left 15)" bash scripts/gpu_collect.sh "$@" >> "$OUT/collect.log" 2>&1; }
CALL=${1:?call2, call3, call4 or e2e}
case $CALL in
  call2)
    nvidia-smi -L
    collect train exhaustive repeat &
    ( export QUACK_CACHE_DIR=/tmp/quack-cache-gpu1  # not the collector's: separate writers
      on 1 timeout 180 python -m pytest -m gpu tests/test_launcher.py tests/test_inductor.py -q \
        -p no:cacheprovider > "$OUT/gpu_tests_inductor.log" 2>&1
      e2e 1 1 16 128 ) &
    wait ;;
  call3)
    ( collect train exhaustive repeat
      on 0 timeout 300 python -m pytest -m gpu tests/test_gpu_harness.py -q -p no:cacheprovider \
        > "$OUT/gpu_tests.log" 2>&1
      e2e 0 1024 ) &
    ( on 1 python scripts/tune_gpu_bench.py run --out "$TUNE/tune_runs.jsonl" \
        --dataset "$TUNE/data" --budget-s "$(left 200)" > "$TUNE/tune.log" 2>&1; e2e 1 4096 ) &
    wait
    tar -C "$TUNE" -czf "$OUT/tune.tgz" . ;;
  call4)
    RESERVE=250; e2e 0 1 16 128 1024 8192 & e2e 1 4096 8192 128 16 1 & wait
    CUTETUNE_FLEET_EACH_S=${CUTETUNE_FLEET_EACH_S:-80} bash scripts/fleet_throughput.sh one two report \
      > "$OUT/fleet.log" 2>&1 ;;
  e2e)
    WARM_FOR="predicted reduced"
    ( on 0 timeout 150 python -m pytest -m gpu tests/test_inductor.py -q -p no:cacheprovider \
        > "$OUT/gpu_tests_inductor.log" 2>&1
      e2e 0 1 16 128 1024 4096 8192 ) &
    e2e 1 8192 4096 1024 128 16 1 &
    wait ;;
esac
tar -C "$E2E" -czf "$OUT/e2e.tgz" .
tail -n 5 "$E2E/e2e.log" 2>/dev/null; tail -n 3 "$OUT/collect.log" 2>/dev/null; ls -la "$OUT"
