#!/usr/bin/env python
"""Whether a graph compiled with cutetune's early-prefetch pass in Inductor's pre-grad slot is
cached by Inductor's FX-graph cache and reloaded by the next fresh process, with cutetune's
graph passes as they are and, for comparison, without ``ChainedPass``'s pickling methods
(the pass as it was before them): two fresh processes per variant, each with a cache of its
own. The graph is ``tests/test_inductor.py``'s ``EARLY_PASS_FRESH_PROCESS`` (a CPU compile).

  python scripts/fx_cache_probe.py --cache-dir DIR [--out OUT.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "test_inductor.py"
WITHOUT = ("from cutetune.tuner import graph_pass as g\n"
           "del g.ChainedPass.__reduce__, g.ChainedPass.__deepcopy__, g.ChainedPass.__copy__\n")


def fresh_process_script() -> str:
    tree = ast.parse(TESTS.read_text())
    return next(textwrap.dedent(n.value.args[0].value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "")
                == "EARLY_PASS_FRESH_PROCESS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    script, res = fresh_process_script(), {"torch": torch.__version__}
    for variant, preamble in (("without_pickling_methods", WITHOUT), ("as_is", "")):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(args.cache_dir / variant),
               "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", preamble + script], env=env,
                                 capture_output=True, text=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0
                        else {"error": out.stderr[-1000:]})
        res[variant] = runs
    print(json.dumps(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
