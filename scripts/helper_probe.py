"""How long the compile helper takes to start on this host, alone and beside a cold compile.

Reduced mode's first benchmark waits for the helper (``tuner/prefetch.py``): its start, then an
interpreter importing torch, cutlass and quack, took 9.9-13.9 s on the H200 host during a
reduced-mode compile (``timeline`` in data/bench/e2e_h200_1gpu_timeline.json, _waits.json),
while quack's import alone took 2.5-2.7 s there (data/bench/import_probe_h200.json). Each case
runs in a fresh interpreter and waits for the helper's ``imported`` line:

- ``alone``: a helper spawned as a fresh interpreter (as before cutetune forked it) with ``-X
  importtime``, whose top-level modules are kept; nothing else runs;
- ``compile``: the same while the process compiles the benchmark's MLP with Inductor's
  defaults, from an empty Inductor cache (the CPU the machine spent meanwhile is kept);
- ``compile_1thread``: the same with Inductor's compile workers off (``compile_threads=1``):
  what its worker pool costs the helper;
- ``fork``: the helper as ``KernelPrefetcher.start`` forks it, from a process that has
  imported cutetune's Inductor integration and initialized CUDA (as a user's has by then);
  it then compiles one kernel, which this process launches against ``torch.mm`` (the
  helper's and this process's memory are kept);
- ``fork_compile``: the same beside the MLP's compile;
- ``fork_early``: the helper forked as ``cutetune.enable`` forks it, before anything of
  Inductor is imported; this process then imports cutetune's Inductor integration and
  compiles the MLP beside the helper's imports.

    python scripts/helper_probe.py --repeats 2 --out data/bench/helper_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HIDDEN, _cpu_during, _cpu_sample, _workloads  # noqa: E402

CASES = ("alone", "compile", "compile_1thread", "fork", "fork_compile", "fork_early")
# how the spawned helper ran before cutetune forked it
SPAWN = ("import sys; from cutetune.tuner.prefetch import serve; "
         "serve(sys.argv[1], int(sys.argv[2]), 0, sys.stdout)")


def _top_imports(path: Path, n: int = 12) -> list[tuple[str, float]]:
    """The ``-X importtime`` top-level modules (the ones the script itself imported) that took
    longest, in seconds, cumulative."""
    top = []
    for line in path.read_text().splitlines():
        if not line.startswith("import time:") or "|" not in line[13:]:
            continue
        _, cumulative, name = line[12:].split("|")
        if cumulative.strip().isdigit() and not name.startswith("  "):
            top.append((name.strip(), int(cumulative) / 1e6))
    return sorted(top, key=lambda kv: -kv[1])[:n]


def _memory_kib(pid: int) -> dict | None:
    """A process's resident and private (copied or its own) memory, KiB, from
    /proc/PID/smaps_rollup (None where there is none)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    fields = {ln.split(":")[0]: int(ln.split()[1]) for ln in rollup[1:] if ln.endswith("kB")}
    return {k: fields.get(k) for k in ("Rss", "Pss", "Private_Clean", "Private_Dirty")}


def _compile_mlp(torch, m: int) -> None:
    module = _workloads(torch)["mlp"]().to("cuda", torch.bfloat16).eval()
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.compile(module)(x)
    torch.cuda.synchronize()


def spawned(case: str, m: int, arch: str, tmp: str) -> dict:
    import torch

    from cutetune.tuner.prefetch import default_workers

    if case == "compile_1thread":
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    stderr = Path(tmp, "importtime.txt")
    imported = {}
    t0, cpu0 = time.perf_counter(), _cpu_sample()
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-c", SPAWN, arch, str(default_workers())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr.open("w"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True)

    def read():
        for line in proc.stdout:
            if line.startswith("imported"):
                imported.update(s=time.perf_counter() - t0, line=line.strip(),
                                cpu=_cpu_during(cpu0, _cpu_sample()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = {"case": case}
    if case != "alone":
        _compile_mlp(torch, m)
        out["compile_s"] = time.perf_counter() - t0
    proc.stdin.close()
    proc.wait(timeout=120)
    reader.join(timeout=5)
    out.update(helper_imported_s=imported.get("s"), helper_line=imported.get("line"),
               cpu_until_imported=imported.get("cpu"), top_imports=_top_imports(stderr))
    return out


def forked(case: str, m: int, arch: str) -> dict:
    import importlib

    import torch

    from cutetune.space.config import quack_default_config
    from cutetune.space.problem import GemmProblem
    from cutetune.tuner.launcher import quack_mm_out
    from cutetune.tuner.prefetch import KernelPrefetcher, kernel_key

    if case != "fork_early":
        importlib.import_module("cutetune.tuner.inductor")  # what its enable() has imported
    torch.zeros(1, device="cuda")  # CUDA initialized, as in a user's process by then
    n = k = 4096
    problem, config = GemmProblem(m, n, k, b_major="k"), quack_default_config(arch)
    pf = KernelPrefetcher(arch)
    t0 = time.perf_counter()
    pf.start()
    out = {"case": case, "start_s": time.perf_counter() - t0}
    if case == "fork_early":
        importlib.import_module("cutetune.tuner.inductor")
        out["inductor_import_s"] = time.perf_counter() - t0
    if case in ("fork_compile", "fork_early"):
        _compile_mlp(torch, m)
        out["compile_s"] = time.perf_counter() - t0
    pf.submit([(problem, config)])
    out["kernel_built"] = pf.wait_for([kernel_key(problem, config)], timeout=120)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    t1 = time.perf_counter()
    got = quack_mm_out(a, b, torch.empty(m, n, device="cuda", dtype=torch.bfloat16), config)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    memory = _memory_kib(pf._proc.pid)
    imported = [(t, e) for t, e in pf.timeline if e.startswith("imported")]
    out.update(helper_imported_s=imported[0][0] if imported else None,
               helper_line=imported[0][1] if imported else None, timeline=pf.timeline,
               stats=pf.stats(), first_launch_s=time.perf_counter() - t1,
               helper_memory_kib=memory, parent_memory_kib=_memory_kib(os.getpid()),
               rel_err=((got.float() - ref).norm() / ref.norm()).item())
    pf.close()
    return out


def child(case: str, m: int, arch: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        os.environ["QUACK_CACHE_DIR"] = os.path.join(tmp, "quack")  # a cold kernel cache
        return forked(case, m, arch) if case.startswith("fork") else spawned(case, m, arch, tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--out")
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.m, args.arch)))
        return
    if not args.out:
        ap.error("--out is required")
    runs = []
    for repeat in range(args.repeats):
        for case in args.cases:
            res = subprocess.run([sys.executable, __file__, "--child", case, "--m", str(args.m),
                                  "--arch", args.arch], capture_output=True, text=True)
            run = json.loads(res.stdout.splitlines()[-1]) if res.returncode == 0 else {
                "case": case, "error": res.stderr[-2000:]}
            runs.append({"repeat": repeat, **run})
            print(json.dumps(runs[-1])[:400], flush=True)
    median = {case: statistics.median(r["helper_imported_s"] for r in runs
                                      if r["case"] == case and r.get("helper_imported_s"))
              for case in args.cases
              if any(r["case"] == case and r.get("helper_imported_s") for r in runs)}
    report = {"meta": {"command": " ".join(sys.argv), "python": sys.version.split()[0],
                       "cpus": os.cpu_count(), "started": time.time()},
              "runs": runs, "median_helper_imported_s": median}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(median))


if __name__ == "__main__":
    main()
