#!/usr/bin/env bash
# The GPU calls of one device session on nvidia-h200 (one H200, 16 cores, nothing else running:
# step times measured beside another job were not trustworthy, data/bench/e2e_h200.json), from
# the repo root after `source .gpu/2/unpack.sh`. State lives under /tmp between calls.
#   a  probes of where quack's first use spends its time (import profile, whether tvm_ffi builds
#      its torch DLPack add-on), a throwaway compile that warms the page cache, then the
#      torch.compile benchmark (scripts/bench_e2e.py) at M 1 16 with its launch-overhead worker
#   b  CPU/GPU topology; compiled steps of default and cutetune side by side in one process
#      (scripts/step_ab.py) where fresh processes disagreed; the benchmark at M 128 1024
#   c  reduced mode again at M 1 16 (after call a: it no longer waits for kernels already in the
#      disk cache), then the GPU tests of the launcher and Inductor integration
#   d  (after the host-bound rule in tuner/inductor.py) M=128 again: predicted attention beside
#      the default in one process, then default, predicted and reduced with cold kernel caches
#   e  smoke run of scripts/step_ab.py (every mode in one process) at M=1024, attention
#   steps (next session) every M: `python scripts/step_ab.py --m M --out $E2E/ab_mM.json` each,
#      then here `python scripts/step_ab.py --report ab_m*.json --out data/bench/step_h200.json`
#   big  (next session) the benchmark's compile times at M 4096 8192 1024, where the host-bound
#      rule leaves quack candidates (below 1024 every mode compiles the default's choices:
#      `decisions` in data/bench/heuristics_cpu.json)
#   tests  the GPU tests of the launcher and Inductor integration
#   hostbound  (after reduced mode offers Triton templates for host-bound mm) its GPU test, every
#      mode's steps in one process at M 1 16 128 1024, then compile times at M 1 128
#   memory  (after Triton templates were kept to memory-bound GEMMs) steps in one process of
#      attention at M=1024 (compute-bound: ATen again) and M=128 (memory-bound: Triton)
#   triton  (next session) Inductor's timings of ATen and each Triton mm config on small-M LLM
#      shapes (scripts/triton_mm_sweep.py), after a probe of the InductorChoices API it relies on
#   sweep2  the same at M=32 for the families swept, then three more families (kk only);
#      appended locally to data/triton_mm/h200_bf16.jsonl (since stored gzip -9n as .jsonl.gz)
#   verify  (after predicted mode took Triton configs from the heuristics' table) the GPU tests of
#      host-bound mm, every mode's steps in one process at M 1 16 128 plus predicted mode with
#      a table fitted without Llama-3-8B (predicted-heldout), then compile times at M 1 128
#   order  (after verify's predicted and reduced steps were as slow as the default's with the
#      same Triton kernels as the fast modes) the same steps with the modes in another order,
#      recording whether each Triton kernel ran on Inductor's static launcher (a diagnostic
#      since removed: all did; the cause was step_ab.py's Dynamo reset, see its session log)
#   recheck  (after step_ab.py stopped resetting Dynamo between modes; run again after predicted
#      mode weighed a graph's Triton configs by launch costs) the GPU tests of host-bound mm,
#      then every mode's steps in one process at M 1 16 128 (predicted with the shipped Triton
#      table, reduced benchmarking Triton templates), then compile times at M 1 128
#   hostcal  the GPU tests of host-bound mm, then every mode's steps in one process at M 1 16 128
#      with the host probe (tuner.measure.launch_host_us) beside them: recheck without the
#      compile benchmark, to relate each host's step host times to its probe
#   mixed  (after the launch costs gave Triton configs to some of a graph's mm, hedged over
#      the host speeds seen) hostcal's tests and steps, then compile times of default and
#      predicted at M 1 128
#   retime  L2-cold GPU times of ATen and the Triton picks on every swept shape predicted mode
#      asks the table about (scripts/triton_mm_retime.py)
#   retime_top4  the same with the sweep's four fastest configs beside the pick, so that the
#      heuristics give each retimed shape the config that ran it fastest
#   pinned  predicted and reduced mode's steps (the same output code) at M 1 16 128, timed with
#      and without the timing thread pinned to one CPU
#   noise  same-code steps (predicted, reduced and max-autotune share kernels at M 16 and 128)
#      pinned, with the garbage collector on and paused in turn, and the machine's steal time
#   tcache, tcache2  (after cutetune kept the Triton template kernels it chose in its kernel
#      cache) the cache's GPU test, then compile times with it cold and warm, and steps at M=1
#   tcprof  tcache's test and compile times on another machine, then scripts/step_profile.py
#      (GPU kernels against step time) in six fresh processes at M=1
#   exh  Inductor's exhaustive Triton mm list swept on the MLP's GEMMs at M 1 and 16, and its
#      four fastest per shape retimed
#   swiglu  (after cutetune fused SwiGLU's pointwise product into its up projection's quack GEMM)
#      the fused kernel's GPU tests, then its times against cuBLAS + Inductor's pointwise kernel
#      on Llama-3-8B's up projection (scripts/swiglu_bench.py)
#   swiglu_steps  every mode's MLP steps in one process at M 1024 4096 8192, predicted fusing
#   swiglu2  the fused kernel's times on four more model families' up projections at M 1024 to
#      4096, then the Llama MLP's steps at M 2048 4096 8192 with 30 rounds
#   swiglu3  (after the heuristics took the measured fusions) the fused kernel's GPU tests, every
#      mode's MLP steps in one process at M 1024 4096 8192, then compile times at M=4096
#   swiglu4  the fused kernel's GPU tests (with a reload from the FX-graph cache) and the
#      compiled MLP's tests of the Inductor integration, then the MLP's steps at M 2048 4096 8192
#   swiglu5  the fused kernel's GPU tests against fp32 in bf16 and fp16
#   aot  (after the fused SwiGLU kernel ran from a TVM-FFI library that the compile helper
#      builds, with no quack import where the model runs) compile times of default and predicted
#      at M 4096 8192 1024 with cold and warm kernel caches, the GPU tests of the fused kernel,
#      the launcher and the compiled MLP, then where quack's import goes on this host
#      (scripts/import_probe.py)
#   aot2  (after the fix of the library's first launch, found by aot's GPU tests, and the first
#      launch compiling here when the helper is still importing) the fused kernel's GPU tests,
#      then compile times of default and predicted at M 4096 8192 with cold and warm caches
#   aot_steps  the shipped table's fused kernels prebuilt (`cutetune prebuild`, then named
#      scripts/prebuild_fused.py), then
#      every mode's MLP steps in one process at M 2048 4096 8192, launched from the libraries
#   aot3  (after `cutetune prebuild` and the predicted-MLP test's second compile from the
#      helper's library) the fused kernel's GPU tests of the library path and predicted mode,
#      then aot2's compile times twice more: from fresh processes they vary by about a second
#   aot4  (after cutetune shipped the fused kernels' object files) this environment's added to
#      cutetune/data/fused_kernels.zip (`cutetune prebuild --package`, the zip brought back),
#      then aot2's compile times: a cold cache now links the shipped kernels
#   tiered  (after a fused kernel's calls run ATen while the compile helper builds its library,
#      instead of compiling through quack in the process) the fused kernel's GPU tests of the
#      library path and predicted mode, then compile times of default and predicted at M 4096
#      8192 with no prebuilt kernels (a cold cache builds them), twice
#   tiered_steps  every mode's MLP steps in one process at M 2048 4096 8192, reduced mode with
#      them (the fused kernels linked from the shipped objects)
#   tiered_reduced  compile times of max-autotune and reduced at M 4096 8192 with no prebuilt
#      kernels, reduced with cold and warm caches
#   timeline  (after the compile helper reported its imports and each job's start) predicted and
#      reduced at M=4096, cold, with no prebuilt kernels: where the helper's time goes
#   lazy  (after predicted mode started the helper only for a fused kernel to build) the GPU
#      tests of predicted mode, then default and predicted at M 4096 8192, cold and warm, with no
#      prebuilt kernels and then with the shipped ones
#   waits  (after reduced mode logged its waits for the compile helper) max-autotune and reduced
#      at M=4096, cold, with no prebuilt kernels
#   graphs  the fused kernel's GPU tests of the library path, predicted mode and CUDA graphs
#   helper  (after 0225b8b and 336d2dd) the fused kernel's GPU tests of the library path,
#      predicted mode and CUDA graphs, then where the compile helper's start goes on this host
#      (scripts/helper_probe.py)
#   fork  (after the compile helper was forked from the compiling process instead of started as
#      a fresh interpreter) the GPU tests of the forked helper, the compiled MLP in every mode,
#      the fused kernel's library path, predicted mode and CUDA graphs; the helper's start
#      forked (scripts/helper_probe.py); then compile times of max-autotune and reduced at M
#      4096 8192 with no prebuilt kernels, reduced with cold and warm caches
#   fork_predicted  compile times of default and predicted at M 4096 8192 with no prebuilt
#      kernels, cold and warm, then fork's compile times again
#   fork2  (after the forked helper froze its objects against the garbage collector, and the
#      probe kept the helper's memory) fork's GPU tests and probe, then compile times of every
#      mode at M 4096 8192 with no prebuilt kernels, cutetune's with cold and warm caches
#   library  (after reduced mode's plain mm kernels ran from TVM-FFI libraries that the compile
#      helper builds, with no quack import where the model runs) the GPU tests of the plain and
#      fused libraries, the forked helper, the compiled MLP in every mode, predicted mode and
#      CUDA graphs; then compile times of max-autotune and reduced at M 4096 8192 with no
#      prebuilt kernels, reduced with cold and warm caches, twice
#   library3  the forked helper's GPU test again (after a fix of the test), then the library
#      case's compile times a third time
#   early  (after `cutetune.enable` forked reduced mode's compile helper before Inductor's
#      import, the helper imported quack with torch.compile left uncompiled, and a pre-grad pass
#      sent the graph's kernels from Dynamo's graph) library's GPU tests; the helper's start
#      forked before and after Inductor's import (scripts/helper_probe.py); then compile times
#      of max-autotune and reduced at M 4096 8192 with no prebuilt kernels, reduced with cold
#      and warm caches, entered through cutetune.enable, then reduced alone entered through
#      cutetune.tuner.inductor.enable (the helper forked after Inductor's import)
#   early2  early's compile times again, both entries
#   early3  (after the benchmark imported Inductor after enable(), as a script that enables
#      cutetune before it compiles does, and the forked helper's test stopped expecting no
#      object in quack's cache beside a library) the GPU tests of the forked helper and of the
#      compiled MLP (bf16 and fp16), then early's compile times: max-autotune and reduced
#      entered through cutetune.enable, reduced through cutetune.tuner.inductor.enable, and
#      reduced through cutetune.enable again
#   final  (after the fusion and early-prefetch passes shared their base class and the
#      early-prefetch pass left symbolic shapes alone) the early case's GPU tests, then compile
#      times of max-autotune and reduced (through cutetune.enable) at M 4096 8192
#   dynamic  (after a GEMM whose M is dynamic got a config per range of M, plain and fused) the
#      library case's GPU tests, which hold the dynamic-M tests of the compiled MLP and of
#      predicted mode's fusion
#   dynamic2  the two dynamic-M GPU tests again, their helper's failed builds named, then
#      dynamic_steps
#   dynamic3  (after the fused ops were lowered as extern kernels, no custom-op dispatch in
#      compiled code) the library case's GPU tests, then dynamic_steps
#   all_gpu  every GPU test of every file, each file's failures and count kept
#   dynamic_steps  every mode compiled once with a dynamic M and timed at M 1 to 8192 in one
#      process (scripts/step_dynamic.py)
#   small_fusion  (after a static graph's host-bound up projection fused where the GPU measured it
#      faster, and the unfused product ran as one Triton pass) the fused kernel against cuBLAS +
#      Inductor's pointwise kernel on Llama-3-8B's up projection at M 1 to 256
#      (data/bench/swiglu_small_h200.json; the heuristics are emitted from it on a CPU host:
#      the GPU host lacks pyarrow)
#   small_tests  the GPU tests of the fused kernel (the unfused product's kernel among them) and
#      of the Inductor integration
#   small_steps  (with the heuristics emitted from small_fusion's times) this environment's fused
#      kernels packaged for them, every mode's MLP steps in one process at M 1 16 128, the GPU
#      tests of predicted mode and CUDA graphs, then dynamic_steps with reduced mode too
#   small_compile  (after cutetune's graph passes pickled as their uuid) torch 2.11's FX-graph
#      cache with the early-prefetch pass in the pre-grad slot, with the passes as they were and
#      as they are (scripts/fx_cache_probe.py), the CPU tests of it, then compile times of
#      default and predicted at M 1 16 128, where predicted now fuses, cold and warm
#   small_compile2  small_compile's compile times again at M 16 128 (its budget ran out before 128)
#   cond_compile  what a run-time switch between two compiled variants of the MLP costs a step
#      (scripts/cond_probe.py), then compile times of default and predicted at M 16 and 1,
#      cold and warm, twice (single fresh-process samples had differed by up to 3 s)
#   small_steps2  every mode's MLP and attention steps in one process at M 1 16 128 (the
#      static graphs' 1 % check on another machine)
#   unfused_steps  the MLP's steps at M 1 16 128 with predicted mode with and without the
#      SwiGLU fusion (predicted-unfused: the up projection then takes its Triton template) beside
#      default and max-autotune, in one process per M
#   templated_steps  (after the fusion pass left a templated up projection to its Triton
#      template) the MLP's steps at M 1 16 128, then the GPU tests of predicted mode's fusion
#   templated_compile  compile times of default and predicted at M 16 and 1, cold and warm,
#      with the up projection left to its template
#   rounds_compile  compile times of default and predicted at M 1 and 16, cold and warm, in three
#      rounds (bench_e2e.py --rounds: a check's median over rounds of paired differences), each
#      compile's Dynamo and Inductor phases recorded
#   rounds_compile128  the same at M=128 (with the attention's phases, fixed since)
#   templated_steps2  templated_steps' MLP steps on another machine, no tests
#   launch_probe  host and GPU time of one small-M GEMM launch by ATen, by cutetune's quack
#      extern from a TVM-FFI library and by that library's bare call, then single-GEMM graphs
#      compiled by default, max-autotune (Triton only) and predicted with the library
#      (scripts/launch_probe.py)
#   gemv_probe  the MLP and attention projections at M 1 4 16 128 with each linear as a Triton
#      reduction (up to M=16: scripts/gemv_probe.py) beside default, max-autotune and predicted,
#      static shapes, all M in one process, interleaved rounds, the timing thread pinned
#   tune  the GPU tests of the tuning loop (its 2-worker compile pool) and of host-bound mm
#      (reduced mode's Triton feedback rows)
# The benchmark compares all four modes, cutetune's with cold and warm kernel caches.
# nvidia-smi samples clocks, power and temperature all along. Results are packed into $OUT.
set -uo pipefail
CALL=${1:?a or b}
DEADLINE=$(( $(date +%s) + ${CUTETUNE_CALL_S:-560} ))
left() { echo $(( DEADLINE - $(date +%s) - ${1:-0} )); }
E2E=/tmp/e2e
export PYTHONUNBUFFERED=1 QUACK_CACHE_DIR=/tmp/quack-cache PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# quack fingerprints an epilogue's functions by source unless they are installed code, which it
# tells by a site-packages folder in their path; the bundle installs into /tmp/gpu-site, where
# cutlass's internals would be fingerprinted too and fail (a ContextVar has no key). So the
# bundle is imported through a path that says site-packages, as a pip install's would.
mkdir -p /tmp/gpu-env && ln -sfn /tmp/gpu-site /tmp/gpu-env/site-packages
export PYTHONPATH=${PYTHONPATH//\/tmp\/gpu-site/\/tmp\/gpu-env\/site-packages}
mkdir -p "$E2E/code" "$OUT"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 500 > "$E2E/smi_$CALL.csv" 2>&1 &
SMI=$!
bench() {  # bench OUT_NAME EXTRA_ARGS...: every mode (or --modes) at the given M values
  local name=$1; shift
  python scripts/bench_e2e.py --modes default max-autotune predicted reduced \
    --warm-for predicted reduced --save-code "$E2E/code" --budget-s "$(left 20)" "$@" --out "$E2E/$name.json" 2>&1 | tee -a "$E2E/e2e.log"
}
gpu_tests() {  # gpu_tests TIMEOUT_S PYTEST_ARGS...: the GPU tests, the whole log kept, the
  # failures and the count in gpu_tests_$CALL.log
  local limit=$1; shift
  timeout "$limit" python -m pytest -m gpu "$@" -q --tb=short -p no:cacheprovider 2>&1 \
    | tee "$E2E/gpu_tests_$CALL.full.log" | grep -E "^(FAILED|ERROR|E  )|passed|failed" \
    | tail -n 40 | tee "$E2E/gpu_tests_$CALL.log"
}
# the plain and fused libraries, the forked helper, the compiled MLP, predicted mode, CUDA graphs
LIBRARY_TESTS="library or forked or compiled_llama_mlp or predicted_mode or cuda_graphs"
host_bound_steps() {  # host_bound_steps TAG RESERVE_S: the GPU tests of host-bound mm, then
  # every mode's steps in one process at M 1 16 128, leaving RESERVE_S of the call for later;
  # timed on one CPU since call pinned (same-code steps differed by 1.1 % pinned, 3.0 % not)
  timeout 150 python -m pytest -m gpu tests/test_inductor.py -k "host_bound" -q \
    -p no:cacheprovider 2>&1 | tail -n 3 | tee "$E2E/gpu_tests_$CALL.log"
  for m in 1 16 128; do
    timeout "$(left "$2")" python scripts/step_ab.py --m "$m" --out "$E2E/ab_$1_m$m.json" \
      --save-code "$E2E/code_$1" --pin-cpu 6 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
  done
}
mlp_steps() {  # mlp_steps TAG ROUNDS RESERVE_S "MODES" M...: the MLP's steps in one process per M
  local tag=$1 rounds=$2 reserve=$3 modes=$4; shift 4
  for m in "$@"; do
    timeout "$(left "$reserve")" python scripts/step_ab.py --m "$m" --workloads mlp \
      --rounds "$rounds" --modes $modes --out "$E2E/ab_${tag}_m$m.json" \
      --save-code "$E2E/code_$tag" --pin-cpu 6 2>&1 | tail -n 1 | cut -c 1-600 | tee -a "$E2E/ab.log"
  done
}
dynamic_steps() {  # every mode compiled once with a dynamic M, timed at each M in one process
  # (step_dynamic.py's arguments, such as --modes, may follow)
  timeout "$(left 10)" python scripts/step_dynamic.py --save-code "$E2E/code_dynamic" \
    --pin-cpu 6 --out "$E2E/step_dynamic.json" "$@" 2>&1 | tail -n 5 | tee "$E2E/step_dynamic.log"
}
case $CALL in
  a)
    nvidia-smi -L
    { python - <<'EOF'
import os, torch
print("torch", torch.__version__, "native DLPack exchange API:",
      hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
d = os.path.expanduser("~/.cache/tvm-ffi")
print("tvm-ffi cache before quack's first import:", os.listdir(d) if os.path.isdir(d) else None)
EOF
      for i in 1 2; do  # the first import on a fresh machine, then a repeat
        TIMEFORMAT="import $i: %R s wall"
        time python -X importtime -c "import torch, torch._inductor.compile_fx, \
torch._inductor.select_algorithm; import quack.gemm_interface" 2> "$E2E/importtime_$i.txt"
        tail -n 1 "$E2E/importtime_$i.txt"
      done
      ls ~/.cache/tvm-ffi 2>&1
    } 2>&1 | tee "$E2E/probe.log"
    python scripts/bench_e2e.py --ms 16 --modes default --skip-overhead --out /tmp/warmup.json \
      > /dev/null 2>&1  # page cache, driver and cuBLAS warm-up; not a result
    bench part_a --ms 1 16 ;;
  b)
    { nvidia-smi topo -m; lscpu; } > "$E2E/topology.txt" 2>&1
    for ab in "predicted attn 1" "reduced mlp 16"; do
      set -- $ab
      timeout 150 python scripts/step_ab.py --mode "$1" --workload "$2" --m "$3" \
        --out "$E2E/ab_$1_$2_m$3.json" 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
    done
    bench part_b --ms 128 1024 --skip-overhead ;;
  c)
    bench part_c --ms 1 16 --modes reduced --skip-overhead
    timeout "$(left 10)" python -m pytest -m gpu tests/test_launcher.py tests/test_inductor.py -q \
      -p no:cacheprovider 2>&1 | tee "$E2E/gpu_tests.log" ;;
  d)
    timeout 150 python scripts/step_ab.py --mode predicted --workload attn --m 128 \
      --out "$E2E/ab_predicted_attn_m128.json" 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
    bench part_d --ms 128 --modes default predicted reduced --warm-for --skip-overhead ;;
  e)
    timeout "$(left 10)" python scripts/step_ab.py --m 1024 --modes default predicted reduced \
      --workloads attn --rounds 5 --out "$E2E/ab_smoke_m1024.json" 2>&1 | tail -n 3 ;;
  steps)
    for m in 1 16 128 1024 4096 8192; do
      [ "$(left 120)" -gt 0 ] || { echo "no time for M=$m"; continue; }
      timeout "$(left 10)" python scripts/step_ab.py --m "$m" --out "$E2E/ab_m$m.json" 2>&1 \
        | tail -n 1 | tee -a "$E2E/ab.log"
    done ;;
  big)
    bench part_big --ms 4096 8192 1024 --skip-overhead ;;
  tests)
    timeout "$(left 10)" python -m pytest -m gpu tests/test_launcher.py tests/test_inductor.py -q \
      -p no:cacheprovider 2>&1 | tee "$E2E/gpu_tests.log" ;;
  hostbound)
    timeout 150 python -m pytest -m gpu tests/test_inductor.py -k host_bound -q \
      -p no:cacheprovider 2>&1 | tail -n 3 | tee "$E2E/gpu_tests_hostbound.log"
    for m in 1 16 128 1024; do
      timeout "$(left 150)" python scripts/step_ab.py --m "$m" --out "$E2E/ab_hb_m$m.json" 2>&1 \
        | tail -n 1 | tee -a "$E2E/ab.log"
    done
    bench part_hb --ms 1 128 --modes default max-autotune reduced --warm-for --skip-overhead ;;
  memory)
    for m in 1024 128; do
      timeout "$(left 5)" python scripts/step_ab.py --m "$m" --workloads attn \
        --modes default predicted reduced --out "$E2E/ab_mb_m$m.json" 2>&1 \
        | tail -n 1 | tee -a "$E2E/ab.log"
    done ;;
  triton)
    python -c "import torch; from torch._inductor.choices import InductorChoices as C; \
print(torch.__version__, 'get_ktc', hasattr(C, 'get_ktc'), \
'_need_to_fix_layout', hasattr(C, '_need_to_fix_layout'))" 2>&1 | tee "$E2E/probe.log"
    python scripts/triton_mm_sweep.py --out "$E2E/triton_mm.jsonl" --budget-s "$(left 60)" \
      2>&1 | tee "$E2E/triton_mm.log" ;;
  sweep2)
    python scripts/triton_mm_sweep.py --out "$E2E/triton_mm2.jsonl" --majors kk --ms 32 \
      --families llama3_8b llama3_70b llama3.2_1b --budget-s "$(left 300)" 2>&1 \
      | grep -E "^(kk|budget|[0-9]+ shapes)" | tee "$E2E/triton_mm2.log"
    python scripts/triton_mm_sweep.py --out "$E2E/triton_mm2.jsonl" --majors kk \
      --ms 1 16 32 64 128 --families qwen2.5_7b mistral_nemo_12b phi3_mini \
      --budget-s "$(left 25)" 2>&1 | grep -E "^(kk|budget|[0-9]+ shapes)" \
      | tee -a "$E2E/triton_mm2.log" ;;
  verify)
    timeout 150 python -m pytest -m gpu tests/test_inductor.py -k "host_bound" -q \
      -p no:cacheprovider 2>&1 | tail -n 3 | tee "$E2E/gpu_tests_triton.log"
    python scripts/triton_mm_report.py --sweep data/triton_mm/h200_bf16.jsonl.gz \
      --out "$E2E/triton_mm_report.json" --heldout-family llama3_8b \
      --heldout-heuristics "$E2E/heuristics_without_llama3_8b.json" > /dev/null
    for m in 1 16 128; do
      timeout "$(left 150)" python scripts/step_ab.py --m "$m" --out "$E2E/ab_tt_m$m.json" \
        --heldout-model "$E2E/heuristics_without_llama3_8b.json" 2>&1 | tail -n 1 \
        | tee -a "$E2E/ab.log"
    done
    bench part_tt --ms 1 128 --modes default predicted --warm-for predicted --skip-overhead ;;
  order)
    python scripts/triton_mm_report.py --sweep data/triton_mm/h200_bf16.jsonl.gz \
      --out "$E2E/triton_mm_report.json" --heldout-family llama3_8b \
      --heldout-heuristics "$E2E/heuristics_without_llama3_8b.json" > /dev/null
    for spec in "attn 1" "attn 16" "mlp 128"; do
      set -- $spec
      timeout "$(left 10)" python scripts/step_ab.py --m "$2" --workloads "$1" \
        --modes predicted reduced max-autotune default --rounds 9 \
        --heldout-model "$E2E/heuristics_without_llama3_8b.json" \
        --out "$E2E/ab_order_$1_m$2.json" 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
    done ;;
  recheck)
    host_bound_steps rc 150
    bench part_rc --ms 1 128 --modes default max-autotune predicted reduced \
      --warm-for predicted --skip-overhead ;;
  hostcal|mixed)
    host_bound_steps hc "$([ "$CALL" = hostcal ] && echo 10 || echo 150)"
    [ "$CALL" = hostcal ] || bench part_mx --ms 1 128 --modes default predicted \
      --warm-for predicted --skip-overhead ;;
  pinned)  # host noise with and without the timing thread pinned: predicted and reduced
    # compile the same code at M <= 128, so their step ratio is the noise (data/reports/gpu/
    # h200_1gpu_s7: up to 16 % unpinned)
    for m in 1 16 128; do
      for pin in none 6; do
        timeout "$(left 10)" python scripts/step_ab.py --m "$m" --modes predicted reduced \
          $([ "$pin" = none ] || echo --pin-cpu "$pin") --save-code "$E2E/code_pin$pin" \
          --out "$E2E/ab_pin${pin}_m$m.json" 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
      done
    done ;;
  noise)  # what pinning left of the same-code noise (recheck pinned, 2026-11-30: attention
    # at M=128 with the same four templates in predicted and max-autotune 1.060 apart): each
    # M with Python's garbage collector on and paused, alternately, twice, machine steal logged
    for rep in 1 2; do
      for m in 128 16; do
        for g in on off; do
          timeout "$(left 10)" python scripts/step_ab.py --m "$m" \
            --modes max-autotune predicted reduced --pin-cpu 6 $([ "$g" = on ] || echo --gc-off) \
            --out "$E2E/ab_gc${g}_m${m}_$rep.json" 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
        done
      done
    done ;;
  tcache|tcache2)  # (after cutetune kept its Triton template kernels in its kernel cache) the
    # GPU tests of that cache and of host-bound mm, then compile times at M 1 128 with the
    # template cache cold and warm: default and predicted (tcache), max-autotune and reduced
    # and every mode's steps at M=1 (tcache2)
    if [ "$CALL" = tcache ]; then
      timeout 240 python -m pytest -m gpu tests/test_inductor.py -k "template_kernel_cache or \
host_bound" -q -p no:cacheprovider 2>&1 | tail -n 3 | tee "$E2E/gpu_tests_$CALL.log"
      bench part_tc --ms 1 128 --modes default predicted --warm-for predicted --skip-overhead
    else
      bench part_tc2 --ms 1 128 --modes max-autotune reduced --warm-for reduced --skip-overhead \
        --budget-s "$(left 170)"
      timeout "$(left 5)" python scripts/step_ab.py --m 1 --out "$E2E/ab_tc_m1.json" \
        --pin-cpu 6 2>&1 | tail -n 1 | tee -a "$E2E/ab.log"
    fi ;;
  tcprof)  # tcache's first part on another machine, then where the default's compiled MLP
    # step at M=1 spends its time (GPU kernels or host) in six fresh processes
    timeout 240 python -m pytest -m gpu tests/test_inductor.py -k "template_kernel_cache" -q \
      -p no:cacheprovider 2>&1 | tail -n 3 | tee "$E2E/gpu_tests_$CALL.log"
    bench part_tp --ms 1 128 --modes default predicted --warm-for predicted --skip-overhead \
      --budget-s "$(left 200)"
    for i in 1 2 3 4 5 6; do
      [ "$(left 45)" -gt 0 ] || break
      timeout "$(left 5)" python scripts/step_profile.py --m 1 --out "$E2E/prof_m1_$i.json" \
        2>&1 | tail -n 4 | tee -a "$E2E/prof.log"
    done ;;
  exh)  # Inductor's exhaustive Triton mm list on the MLP's GEMMs at M 1 and 16 (its default
    # list lacks a down-projection config as fast as cuBLAS: data/bench/step_profile_h200_m1),
    # then the four fastest per shape retimed L2-cold beside ATen and the table's pick
    python scripts/triton_mm_sweep.py --out "$E2E/triton_mm_exh.jsonl" --families llama3_8b \
      --layers 4096:14336 14336:4096 --ms 1 16 --majors kk --search-space EXHAUSTIVE \
      --budget-s "$(left 240)" 2>&1 | tee "$E2E/triton_mm_exh.log"
    timeout "$(left 10)" python scripts/triton_mm_retime.py --sweep "$E2E/triton_mm_exh.jsonl" \
      --top 4 --out "$E2E/h200_bf16_retimed_exh.jsonl" --budget-s "$(left 60)" 2>&1 \
      | tee "$E2E/retime_exh.log" ;;
  swiglu)
    timeout 240 python -m pytest -m gpu tests/test_swiglu.py -q -p no:cacheprovider 2>&1 \
      | tail -n 5 | tee "$E2E/gpu_tests_$CALL.log"
    timeout "$(left 10)" python scripts/swiglu_bench.py --ms 1024 2048 4096 8192 \
      --out "$E2E/swiglu_h200.json" 2>&1 | tee "$E2E/swiglu.log" ;;
  swiglu_steps)
    mlp_steps swiglu 15 5 "default max-autotune predicted" 1024 4096 8192 ;;
  swiglu2)
    timeout "$(left 300)" python scripts/swiglu_bench.py --ms 1024 2048 4096 --shapes 18944:3584 \
      28672:8192 14336:5120 8192:3072 --out "$E2E/swiglu_families_h200.json" 2>&1 \
      | grep -v -i "warn\|block_copy\|from cutlass" | tee "$E2E/swiglu_families.log"
    mlp_steps swiglu2 30 5 "default max-autotune predicted" 2048 4096 8192 ;;
  swiglu3)
    timeout 150 python -m pytest -m gpu tests/test_swiglu.py -q -p no:cacheprovider 2>&1 \
      | tail -n 3 | tee "$E2E/gpu_tests_$CALL.log"
    mlp_steps swiglu3 20 130 "default max-autotune predicted reduced" 1024 4096 8192
    bench part_sw3 --ms 4096 --modes default predicted --warm-for predicted --skip-overhead \
      --budget-s "$(left 10)" ;;
  swiglu4)
    timeout 240 python -m pytest -m gpu tests/test_swiglu.py tests/test_inductor.py -k \
      "swiglu or fused or compiled_llama_mlp or fx_graph_cache" -q -p no:cacheprovider 2>&1 \
      | tail -n 4 | tee "$E2E/gpu_tests_$CALL.log"
    mlp_steps swiglu4 20 5 "default max-autotune predicted" 2048 4096 8192 ;;
  swiglu5)
    timeout "$(left 10)" python -m pytest -m gpu tests/test_swiglu.py -k matches_fp32 -q \
      -p no:cacheprovider 2>&1 | tail -n 4 | tee "$E2E/gpu_tests_$CALL.log" ;;
  aot)
    bench part_aot --ms 4096 8192 1024 --modes default predicted --warm-for predicted \
      --skip-overhead --budget-s "$(left 230)"
    timeout "$(left 70)" python -m pytest -m gpu tests/test_swiglu.py tests/test_launcher.py \
      tests/test_inductor.py -k "swiglu or fused or launcher or compiled_llama_mlp or \
fx_graph_cache" -q -p no:cacheprovider 2>&1 | tail -n 6 | tee "$E2E/gpu_tests_$CALL.log"
    timeout "$(left 5)" python scripts/import_probe.py --repeats 2 --rounds 30 \
      --out "$E2E/import_probe.json" 2>&1 | tail -n 1 | tee "$E2E/probe.log" ;;
  aot2)
    timeout 200 python -m pytest -m gpu tests/test_swiglu.py -q -p no:cacheprovider 2>&1 \
      | tail -n 6 | tee "$E2E/gpu_tests_$CALL.log"
    bench part_aot2 --ms 4096 8192 --modes default predicted --warm-for predicted \
      --skip-overhead --budget-s "$(left 10)" ;;
  aot3)
    timeout 200 python -m pytest -m gpu tests/test_swiglu.py -k "library or predicted_mode or \
fx_graph_cache" -q -p no:cacheprovider 2>&1 | tail -n 4 | tee "$E2E/gpu_tests_$CALL.log"
    for rep in 1 2; do
      bench "part_aot3_$rep" --ms 4096 8192 --modes default predicted --warm-for predicted \
        --skip-overhead --budget-s "$(left $(( rep == 1 ? 160 : 10 )))"
    done ;;
  aot4)
    python -m cutetune prebuild --package cutetune/data/fused_kernels.zip 2>&1 | tail -n 1 \
      | tee "$E2E/prebuild_$CALL.log"
    cp cutetune/data/fused_kernels.zip "$OUT/"
    bench part_aot4 --ms 4096 8192 --modes default predicted --warm-for predicted \
      --skip-overhead --budget-s "$(left 10)" ;;
  aot_steps)
    python -m cutetune prebuild 2>&1 | tail -n 1 | tee "$E2E/prebuild.log"
    mlp_steps aot 20 5 "default max-autotune predicted" 2048 4096 8192 ;;
  tiered)
    timeout 240 python -m pytest -m gpu tests/test_swiglu.py -k "library or predicted_mode or \
fx_graph_cache" -q -p no:cacheprovider 2>&1 | tail -n 4 | tee "$E2E/gpu_tests_$CALL.log"
    for rep in 1 2; do
      bench "part_tiered_$rep" --ms 4096 8192 --modes default predicted --warm-for predicted \
        --skip-overhead --no-prebuilt-kernels --budget-s "$(left $(( rep == 1 ? 160 : 10 )))"
    done ;;
  tiered_steps)
    mlp_steps tiered 20 5 "default max-autotune predicted reduced" 2048 4096 8192 ;;
  tiered_reduced)
    bench part_tiered_reduced --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  timeline)
    bench part_timeline --ms 4096 --modes predicted reduced --warm-for --skip-overhead \
      --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  lazy)
    timeout 200 python -m pytest -m gpu tests/test_swiglu.py -k "predicted_mode" -q \
      -p no:cacheprovider 2>&1 | tail -n 4 | tee "$E2E/gpu_tests_$CALL.log"
    bench part_lazy --ms 4096 8192 --modes default predicted --warm-for predicted \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 120)"
    bench part_lazy_shipped --ms 4096 8192 --modes predicted --warm-for \
      --skip-overhead --budget-s "$(left 10)" ;;
  waits)
    bench part_waits --ms 4096 --modes max-autotune reduced --warm-for --skip-overhead \
      --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  graphs)
    timeout "$(left 10)" python -m pytest -m gpu tests/test_swiglu.py -k "library or \
predicted_mode or cuda_graphs" -q -p no:cacheprovider 2>&1 | tail -n 30 \
      | tee "$E2E/gpu_tests_$CALL.log" ;;
  helper)
    timeout 260 python -m pytest -m gpu tests/test_swiglu.py -k "library or predicted_mode or \
cuda_graphs" -q -p no:cacheprovider 2>&1 | tail -n 30 | tee "$E2E/gpu_tests_$CALL.log"
    timeout "$(left 10)" python scripts/helper_probe.py --repeats 2 \
      --out "$E2E/helper_probe.json" 2>&1 | tee "$E2E/helper_probe.log" ;;
  fork)
    timeout 300 python -m pytest -m gpu tests/test_inductor.py tests/test_swiglu.py -k "forked \
or compiled_llama_mlp or library or predicted_mode or cuda_graphs" -q -p no:cacheprovider 2>&1 \
      | tail -n 30 | tee "$E2E/gpu_tests_$CALL.log"
    timeout 120 python scripts/helper_probe.py --repeats 2 --cases fork fork_compile \
      --out "$E2E/helper_probe_fork.json" 2>&1 | tee "$E2E/helper_probe_fork.log"
    bench part_fork --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  fork_predicted)
    bench part_fork_predicted --ms 4096 8192 --modes default predicted --warm-for predicted \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 200)"
    bench part_fork_r2 --ms 4096 8192 --modes max-autotune reduced --warm-for \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  fork2)
    timeout 300 python -m pytest -m gpu tests/test_inductor.py tests/test_swiglu.py -k "forked \
or compiled_llama_mlp or library or predicted_mode or cuda_graphs" -q -p no:cacheprovider 2>&1 \
      | tail -n 3 | tee "$E2E/gpu_tests_$CALL.log"
    timeout 120 python scripts/helper_probe.py --repeats 2 --cases fork fork_compile \
      --out "$E2E/helper_probe_fork2.json" 2>&1 | cut -c 1-300 | tee "$E2E/helper_probe_fork2.log"
    bench part_fork2 --ms 4096 8192 --modes default max-autotune predicted reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  library)
    gpu_tests 300 tests/test_launcher.py tests/test_inductor.py tests/test_swiglu.py \
      -k "$LIBRARY_TESTS"
    bench part_library --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 210)"
    bench part_library_r2 --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  early)
    gpu_tests 300 tests/test_launcher.py tests/test_inductor.py tests/test_swiglu.py \
      -k "$LIBRARY_TESTS"
    timeout 120 python scripts/helper_probe.py --repeats 2 --cases fork fork_early \
      --out "$E2E/helper_probe_early.json" 2>&1 | tee "$E2E/helper_probe_early.log"
    bench part_early --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 130)"
    bench part_late --ms 4096 8192 --modes reduced --warm-for reduced --skip-overhead \
      --no-prebuilt-kernels --enable-from cutetune.tuner.inductor --budget-s "$(left 10)" ;;
  early2)
    bench part_early_r2 --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 130)"
    bench part_late_r2 --ms 4096 8192 --modes reduced --warm-for reduced --skip-overhead \
      --no-prebuilt-kernels --enable-from cutetune.tuner.inductor --budget-s "$(left 10)" ;;
  early3)
    gpu_tests 200 tests/test_inductor.py -k "forked or compiled_llama_mlp"
    bench part_early3 --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 220)"
    bench part_late3 --ms 4096 8192 --modes reduced --warm-for reduced --skip-overhead \
      --no-prebuilt-kernels --enable-from cutetune.tuner.inductor --budget-s "$(left 115)"
    bench part_early3_r2 --ms 4096 8192 --modes reduced --warm-for reduced --skip-overhead \
      --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  final)
    gpu_tests 200 tests/test_launcher.py tests/test_inductor.py tests/test_swiglu.py \
      -k "$LIBRARY_TESTS"
    bench part_final --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  dynamic)
    gpu_tests "$(left 10)" tests/test_launcher.py tests/test_inductor.py tests/test_swiglu.py \
      -k "$LIBRARY_TESTS" ;;
  dynamic2)  # the dynamic-M GPU tests again (the helper's failures named), then dynamic_steps
    gpu_tests 200 tests/test_inductor.py tests/test_swiglu.py -k "dynamic_m"
    dynamic_steps ;;
  dynamic3)
    gpu_tests 260 tests/test_launcher.py tests/test_inductor.py tests/test_swiglu.py \
      -k "$LIBRARY_TESTS"
    dynamic_steps ;;
  dynamic_steps)
    dynamic_steps ;;
  small_fusion)
    timeout "$(left 10)" python scripts/swiglu_bench.py --ms 1 16 64 128 256 \
      --out "$E2E/swiglu_small_h200.json" 2>&1 | grep -v -i "warn\|block_copy\|from cutlass" \
      | tee "$E2E/swiglu_small.log" ;;
  small_tests)
    gpu_tests "$(left 10)" tests/test_swiglu.py tests/test_inductor.py ;;
  small_steps)
    timeout 120 python -m cutetune prebuild --package cutetune/data/fused_kernels.zip 2>&1 \
      | tail -n 3 | tee "$E2E/prebuild.log"
    cp cutetune/data/fused_kernels.zip "$E2E/"
    mlp_steps small 15 290 "default max-autotune predicted reduced" 1 16 128
    gpu_tests 150 tests/test_swiglu.py -k "predicted_mode or cuda_graphs"
    dynamic_steps --modes default max-autotune predicted reduced ;;
  all_gpu)
    gpu_tests "$(left 10)" tests/ ;;
  small_compile)
    { python scripts/fx_cache_probe.py --cache-dir /tmp/fx_probe --out "$E2E/fx_cache_probe.json"
      timeout 120 python -m pytest tests/test_inductor.py -k "chained_pass or early_prefetch_pass" \
        -q -p no:cacheprovider 2>&1 | tail -n 2
    } 2>&1 | tee "$E2E/fx_cache_probe.log"
    bench part_small --ms 1 16 128 --modes default predicted --warm-for predicted --skip-overhead ;;
  small_compile2)
    bench part_small2 --ms 128 16 --modes default predicted --warm-for predicted --skip-overhead ;;
  cond_compile)
    timeout 300 python scripts/cond_probe.py --ms 1 16 128 --pin-cpu 6 \
      --out "$E2E/cond_probe.json" 2>&1 | grep "^M=" | tee "$E2E/cond_probe.log"
    bench part_small3 --ms 16 1 --modes default predicted --warm-for predicted --skip-overhead
    bench part_small4 --ms 16 1 --modes default predicted --warm-for predicted --skip-overhead ;;
  small_steps2)
    for m in 1 16 128; do
      timeout "$(left 10)" python scripts/step_ab.py --m "$m" --rounds 15 \
        --out "$E2E/ab_small2_m$m.json" --save-code "$E2E/code_small2" --pin-cpu 6 2>&1 \
        | tail -n 1 | cut -c 1-600 | tee -a "$E2E/ab.log"
    done ;;
  unfused_steps)
    mlp_steps unfused 15 10 "default max-autotune predicted predicted-unfused" 1 16 128 ;;
  templated_steps)
    mlp_steps templated 15 100 "default max-autotune predicted" 1 16 128
    gpu_tests "$(left 10)" tests/test_swiglu.py -k "predicted_mode" ;;
  templated_compile)
    bench part_small5 --ms 16 1 --modes default predicted --warm-for predicted --skip-overhead ;;
  rounds_compile)
    bench part_rounds --ms 1 16 --modes default predicted --warm-for predicted --skip-overhead \
      --rounds 3 ;;
  rounds_compile128)
    bench part_rounds128 --ms 128 --modes default predicted --warm-for predicted \
      --skip-overhead --rounds 3 ;;
  templated_steps2)
    mlp_steps templated2 15 10 "default max-autotune predicted" 1 16 128 ;;
  library3)
    timeout 120 python -m pytest -m gpu tests/test_inductor.py -k forked -q --tb=short \
      -p no:cacheprovider 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" \
      | tee "$E2E/gpu_tests_$CALL.log"
    bench part_library_r3 --ms 4096 8192 --modes max-autotune reduced --warm-for reduced \
      --skip-overhead --no-prebuilt-kernels --budget-s "$(left 10)" ;;
  launch_probe)
    timeout "$(left 10)" python scripts/launch_probe.py --out "$E2E/launch_probe_h200.json" \
      2>&1 | grep -v -i "warn\|block_copy\|from cutlass" | tee "$E2E/launch_probe.log" ;;
  gemv_probe)
    timeout "$(left 10)" python scripts/gemv_probe.py --ms 1 4 16 128 --pin-cpu 6 \
      --out "$E2E/gemv_probe_h200.json" 2>&1 | grep -v -i "warn\|block_copy\|from cutlass" \
      | grep -v "__output_code" | tee "$E2E/gemv_probe.log" ;;
  tune)
    timeout "$(left 10)" python -m pytest -m gpu tests/test_tune.py tests/test_inductor.py \
      -k "gpu_cli or host_bound" -q -s -p no:cacheprovider 2>&1 | tee "$E2E/gpu_tests_$CALL.log" ;;
  retime|retime_top4)
    top=$([ "$CALL" = retime ] && echo 1 || echo 4)
    timeout "$(left 10)" python scripts/triton_mm_retime.py --sweep data/triton_mm/h200_bf16.jsonl.gz \
      --top "$top" --out "$E2E/h200_bf16_retimed${CALL#retime}.jsonl" --budget-s "$(left 60)" \
      2>&1 | tee "$E2E/retime.log" ;;
esac
kill "$SMI" 2>/dev/null
tar -C "$E2E" -czf "$OUT/e2e_$CALL.tgz" .
ls -la "$OUT"
