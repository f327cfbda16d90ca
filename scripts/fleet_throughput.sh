#!/usr/bin/env bash
# Fleet scaling on one host with two GPUs (device kind nvidia-h200-x2): measurements per minute
# of `cutetune collect --workers 1` against `--workers 2` (one worker per GPU), on the same work
# with a warm kernel cache, so the ratio is the GPU side's scaling. The queue is the embedded
# SQLite storage (the GPU host reaches no server). Runs from the repo root after the dependency
# bundle is unpacked, like scripts/gpu_collect.sh. Stages, in the order given; state lives
# under /tmp, so the stages may be split over calls on one warm machine (each <= 10 min):
#   warm    compile every sm90 kernel into the cache, CPU only  -> $OUT/warm_space_check.json
#   one     1 worker for $EACH_S s, fresh study and dataset     -> $OUT/fleet_1.json
#   two     2 workers for $EACH_S s, the same work from scratch  -> $OUT/fleet_2.json
#   report  both runs and their ratio                           -> $OUT/fleet_throughput.json
# e.g. bash scripts/fleet_throughput.sh warm one, then (next call) two report: each run takes
# about EACH_S + 40 s
# Commit $OUT/fleet_throughput.json as data/bench/fleet_throughput_h200x2.json.
set -uo pipefail
# Long windows: each run's start-up (two workers importing the stack at once) counts in its
# rate; 75 s windows gave 1.75x (data/bench/fleet_throughput_h200x2.json at commit 104ef6f),
# 300 s windows 1.99x (that file now).
EACH_S=${CUTETUNE_FLEET_EACH_S:-300}
ROOT=${CUTETUNE_DATA:-/tmp/cutetune-fleet}
export QUACK_CACHE_DIR=/tmp/quack-cache PYTHONUNBUFFERED=1
mkdir -p "$ROOT" "$QUACK_CACHE_DIR" "$OUT"
# The stages may span calls: the report names every call's command, from this file.
echo "CUTETUNE_FLEET_EACH_S=$EACH_S bash scripts/fleet_throughput.sh $*" >> "$ROOT/commands.txt"
# The exhaustive stage of scripts/gpu_collect.sh: every valid config of 40 problems, 1 ms of
# timed GPU time each; all of them kk-major and unbatched, the layout `space check` compiles.
WORK=(--problems exhaustive --configs all --target-ms 1 --item-size 256)

run() {  # run N: N workers on a fresh study and dataset
  local n=$1
  rm -rf "$ROOT/run$n" && mkdir -p "$ROOT/run$n"
  python -m cutetune collect "${WORK[@]}" --workers "$n" --out "$ROOT/run$n/data" \
    --storage "sqlite:///$ROOT/run$n/queue.sqlite" --study "throughput-$n" \
    --time-budget "$EACH_S" --stats "$ROOT/fleet_$n.json" 2>&1 | tail -n 12
  cp "$ROOT/fleet_$n.json" "$OUT/"  # $OUT is emptied per call; the report reads $ROOT
}

for stage in "$@"; do
  echo "=== stage $stage"
  case $stage in
    warm)
      python -m cutetune space check --arch sm90 --cache-dir "$QUACK_CACHE_DIR" \
        --workers "$(nproc)" --quiet --out "$OUT/warm_space_check.json" | tail -n 5 ;;
    one) run 1 ;;
    two) run 2 ;;
    report)
      python - "$ROOT" "$OUT" "$EACH_S" "${WORK[*]}" <<'EOF'
import json, subprocess, sys
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
each_s, work = float(sys.argv[3]), sys.argv[4]
calls = (root / "commands.txt").read_text().splitlines()
runs = {n: json.loads((root / f"fleet_{n}.json").read_text()) for n in (1, 2)}
try:  # the report may also be rebuilt elsewhere from the stats files
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split("\n")
except FileNotFoundError:
    gpus = []
ratio = runs[2]["rows_per_min"] / runs[1]["rows_per_min"]
steady = (runs[2]["steady_rows_per_min"] / runs[1]["steady_rows_per_min"]
          if runs[1].get("steady_rows_per_min") and runs[2].get("steady_rows_per_min") else None)
report = {
    "what": "rows measured per minute by `cutetune collect` fleet workers on one host, "
            "1 worker vs 2 (one per GPU), warm kernel cache, SQLite queue",
    "command": "; then ".join(calls),
    "collect_args": work, "gpus": [g for g in gpus if g],
    "rows_per_min": {n: r["rows_per_min"] for n, r in runs.items()},
    "ratio_2_over_1": ratio, "target_ratio": 1.8, "target_met": ratio >= 1.8,
    "steady_rows_per_min": {n: r.get("steady_rows_per_min") for n, r in runs.items()},
    "steady_ratio_2_over_1": steady,
    "runs": runs,
}
(out / "fleet_throughput.json").write_text(json.dumps(report, indent=1))
print(json.dumps({k: report[k] for k in ("gpus", "rows_per_min", "ratio_2_over_1", "target_met",
                                         "steady_ratio_2_over_1")}))
EOF
      ;;
    *) echo "unknown stage $stage (warm, one, two, report)"; exit 2 ;;
  esac
done
