"""Inductor's timings of ATen and its Triton mm configs for one mm, as a Triton sweep row.

A row is one JSON line: the mm's shape, operand majors, dtype, device and every benchmarked
choice with its time, the format ``models.triton_mm.load_sweep`` reads and ``cutetune emit
--triton-sweep`` fits the Triton table on. scripts/triton_mm_sweep.py writes rows for the shapes
it is given; reduced mode's feedback (``inductor.FeedbackRecorder``) appends those Inductor
measured for a user's own host-bound mm, so the table can be refitted on them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from .triton_mm import CONFIG_KEYS
from ..space.problem import GemmProblem

ATEN_MM = ("mm", "aten_mm")  # extern names of ATen's own mm kernel


def choice_record(choice, ms: float) -> dict:
    """One benchmarked choice: its kind (aten, triton, extern, or its class), name, Triton
    config kwargs (CONFIG_KEYS, when it has them) and time in ms."""
    from torch._inductor.select_algorithm import ExternKernelCaller, TritonTemplateCaller

    rec = {"name": getattr(choice, "name", type(choice).__name__),
           "description": str(getattr(choice, "description", "")), "ms": ms}
    if isinstance(choice, ExternKernelCaller):
        rec["kind"] = "aten" if choice.choice.name in ATEN_MM else "extern"
        rec["kind_detail"] = choice.choice.name
    elif isinstance(choice, TritonTemplateCaller):
        rec["kind"] = "triton"
        ktc = (getattr(choice, "annotations", None) or {}).get("ktc")
        kwargs = ktc.params.to_kwargs() if ktc is not None else {}
        rec["template"] = getattr(getattr(ktc, "template", None), "uid", None)
        rec["config"] = {k: int(kwargs[k]) for k in CONFIG_KEYS if k in kwargs}
    else:
        rec["kind"] = type(choice).__name__
    return rec


def sweep_row(problem: GemmProblem, timings: Mapping, device: str, torch_version: str,
              **extra) -> dict:
    """The row of one mm's benchmark (``timings``: choice -> ms), fastest choice first."""
    return {"m": problem.m, "n": problem.n, "k": problem.k,
            "majors": problem.a_major + problem.b_major, "dtype": problem.dtype,
            "device": device, "torch": torch_version, **extra,
            "choices": sorted((choice_record(c, float(ms)) for c, ms in timings.items()),
                              key=lambda r: r["ms"])}


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append one row as a line, in a single write to a file opened for appending, so a
    reader (or another writer) never sees part of it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def shapes_in(path: str | os.PathLike) -> set[tuple[int, int, int, str]]:
    """(m, n, k, majors) of every row already in a rows file (none if it does not exist):
    the shapes a resumed sweep or retime skips. A torn last line (a run killed in its write)
    is cut off the file, so that the next append starts a whole line."""
    p = Path(path)
    if not p.exists():
        return set()
    raw = p.read_bytes()
    lines = raw.split(b"\n")
    if lines[-1].strip():  # a last row cut short by a killed run: dropped, measured again
        try:
            json.loads(lines[-1])
            with open(p, "ab") as f:  # whole but unended: the next row starts a line
                f.write(b"\n")
        except ValueError:
            with open(p, "r+b") as f:
                f.truncate(len(raw) - len(lines[-1]))
            lines = lines[:-1]
    rows = []
    for i, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{p}, line {i}: not a row ({e}); remove it to resume") from None
    return {(r["m"], r["n"], r["k"], r["majors"]) for r in rows}
