"""Where quack's import goes on this host, and how much of it a background thread hides.

The fused SwiGLU kernel's first launch needs quack's epilogue frontend (and cutlass under it),
which cutetune imports in a thread from the moment the fusion pass rewrites a graph. Whether
that thread hides the import depends on how much of it holds the GIL. Each case runs in a fresh
interpreter that has already imported what a torch.compile has (Inductor's compile_fx and
select_algorithm), so what is timed is quack's and cutlass's share alone:

- ``alone``: wall and CPU seconds (all threads) of ``import cutetune.tuner.quack_epilogues``;
- ``work``: wall seconds of CPU-bound compile work with no import running (tracing the SwiGLU
  patterns through Inductor's decompositions, ``--rounds`` times);
- ``both``: the import in a background thread, as cutetune starts it, while the main thread
  does the same work: seconds until the work is done and until the import is.

A thread hides ``alone + work - both_all`` of the import.

    python scripts/import_probe.py --repeats 3 --out data/bench/import_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time


def _work(rounds: int) -> None:
    import torch

    from cutetune.tuner import fusion_pass

    for _ in range(rounds):
        fusion_pass._patterns.__wrapped__(torch.bfloat16)


def _child(case: str, rounds: int) -> dict:
    import resource
    import threading

    import torch  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.select_algorithm  # noqa: F401

    import cutetune.tuner.inductor  # noqa: F401
    from cutetune.tuner import fusion_pass

    fusion_pass._patterns.__wrapped__(torch.bfloat16)  # the first trace warms torch's caches
    ru0, cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), \
        time.perf_counter()
    out: dict = {"case": case}
    if case == "alone":
        import cutetune.tuner.quack_epilogues  # noqa: F401
        out["import_s"] = time.perf_counter() - t0
    elif case == "work":
        _work(rounds)
        out["work_s"] = time.perf_counter() - t0
    else:
        done = {}

        def load():
            import cutetune.tuner.quack_epilogues  # noqa: F401
            done["import_s"] = time.perf_counter() - t0

        thread = threading.Thread(target=load)
        thread.start()
        _work(rounds)
        out["work_s"] = time.perf_counter() - t0
        thread.join()
        out["import_s"] = done["import_s"]
        out["all_s"] = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out.update(cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - t0,
               block_reads=ru1.ru_inblock - ru0.ru_inblock,
               voluntary_switches=ru1.ru_nvcsw - ru0.ru_nvcsw)
    return out


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="pattern traces in the work")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", choices=("alone", "work", "both"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.rounds)))
        return 0
    runs = []
    for rep in range(args.repeats):
        for case in ("alone", "work", "both"):
            proc = subprocess.run([sys.executable, __file__, "--child", case, "--rounds",
                                   str(args.rounds), "--out", "-"], capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode:
                raise SystemExit(f"{case} failed:\n{proc.stderr[-3000:]}")
            runs.append({"repeat": rep, **json.loads(proc.stdout.splitlines()[-1])})
            print(json.dumps(runs[-1]), flush=True)
    med = {case: {k: _median([r[k] for r in runs if r["case"] == case])
                  for k in ("import_s", "work_s", "all_s", "cpu_s") if k in
                  next(r for r in runs if r["case"] == case)}
           for case in ("alone", "work", "both")}
    summary = {
        "import_alone_s": med["alone"]["import_s"],
        "import_alone_cpu_over_wall": med["alone"]["cpu_s"] / med["alone"]["import_s"],
        "work_alone_s": med["work"]["work_s"],
        "both_work_s": med["both"]["work_s"], "both_all_s": med["both"]["all_s"],
        "hidden_s": med["alone"]["import_s"] + med["work"]["work_s"] - med["both"]["all_s"],
    }
    result = {"meta": {"command": "python " + " ".join([os.path.relpath(__file__)]
                                                       + (argv or sys.argv[1:])),
                       "python": platform.python_version(), "cpus": os.cpu_count(),
                       "started": time.time()},
              "runs": runs, "median": med, "summary": summary}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
