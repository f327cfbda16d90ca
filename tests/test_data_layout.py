"""data/inputs/ holds exactly what the shipped artifacts (cutetune/data/) are built from: every
path that scripts/emit_heuristics.sh and scripts/train_cost_model.py read lies there, and
nothing else does, so a benchmark result under data/bench/ cannot quietly become an input, nor
an input be taken for a result and moved."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INPUTS = REPO / "data" / "inputs"
EMIT = REPO / "scripts" / "emit_heuristics.sh"
TRAIN = REPO / "scripts" / "train_cost_model.py"


def emit_arguments() -> dict[str, list[str]]:
    """emit_heuristics.sh's `cutetune emit` options, each with its values, variables expanded."""
    text = EMIT.read_text()
    for name, value in reversed(re.findall(r"^(\w+)=(\S+)$", text, re.M)):
        text = text.replace(f"${name}/", f"{value}/")  # later variables build on earlier ones
    command = text[text.index("cutetune emit"):].replace("\\\n", " ").splitlines()[0]
    options: dict[str, list[str]] = {}
    for token in command.split()[2:]:
        if token.startswith("--"):
            options[token] = []
        else:
            options[list(options)[-1]].append(token)
    return options


def build_inputs() -> set[str]:
    emit = [v for key, values in emit_arguments().items() if key not in ("--model", "--out")
            for v in values]
    train_datasets = re.findall(r'"(data/inputs/[^"]+)"', TRAIN.read_text())  # SHIPPED's
    return {*emit, *train_datasets}


def test_the_build_scripts_read_data_inputs_and_nothing_else_lies_there():
    inputs = build_inputs()
    assert all(p.startswith("data/inputs/") and (REPO / p).exists() for p in inputs), inputs
    stored = {f for f in INPUTS.rglob("*") if f.is_file()}
    used = {f for f in stored
            if any(f == REPO / p or (REPO / p) in f.parents for p in inputs)}
    assert stored == used, sorted(str(f.relative_to(REPO)) for f in stored - used)


def test_the_shipped_heuristics_were_emitted_from_these_inputs():
    """The shipped file's meta names the files it was emitted from (by the paths of the day);
    the script's inputs are the same files, in the same order."""
    shipped = REPO / "cutetune" / "data" / "heuristics_sm90_bf16.json.gz"
    meta = json.loads(gzip.decompress(shipped.read_bytes()))["meta"]
    options = emit_arguments()
    for option, key in (("--triton-sweep", "triton_sweep"), ("--triton-retimed", "triton_retimed"),
                        ("--triton-steps", "triton_steps"), ("--swiglu-bench", "swiglu_bench")):
        assert [Path(p).name for p in options[option]] == [Path(p).name for p in meta[key]], key
    assert Path(options["--dataset"][0]).name == Path(meta["dataset"]).name
    assert options["--model"] == [meta["model"]]
