"""Decisions by GPU time alone (under CUDA graphs): the candidates timed together per problem
(``models.gpu_times``), their round trip through a heuristics file, and what ``decide`` and
``decide_swiglu`` make of them, replayed on the shipped retime's measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._inductor import config as inductor_config

from cutetune.models import heuristics as hz
from cutetune.models.gpu_times import GpuTimed, retimed_gpu_times
from cutetune.models.heuristics import Grid
from cutetune.models.triton_mm import CONFIG_KEYS, load_retimed
from cutetune.space.config import KernelConfig, quack_default_config
from cutetune.space.problem import GemmProblem
from cutetune.space.rules import is_valid
from cutetune.tuner.inductor import decisions as idec

REPO = Path(__file__).resolve().parent.parent
RETIMED = REPO / "data/inputs/triton_mm/h200_bf16_retimed_top4.jsonl"
Q = quack_default_config("sm90")
GATE, DOWN = (14336, 4096), (4096, 14336)  # Llama-3-8B's gate (and up) and down projections


def llama(m, nk):
    return GemmProblem(m, *nk, a_major="k", b_major="k")


def shipped_rows() -> dict[GemmProblem, dict]:
    return {llama(r["m"], (r["n"], r["k"])): r for r in map(json.loads, RETIMED.open())
            if "timed" in r}


def with_quack(row: dict, ms: float) -> dict:
    """The row with quack's config timed beside ATen and Triton at ``ms``."""
    return {**row, "timed": {**row["timed"], "quack_1": {"ms": ms, "quack_config": Q.to_dict()}}}


class TimedHeuristics:
    """A heuristics stand-in: a fixed top-1 (quack ``Q``, not preferring cuBLAS) and GPU times."""

    def __init__(self, timed: dict[GemmProblem, GpuTimed]):
        self.timed = timed

    def lookup(self, problem):
        return (Q,), False

    def gpu_fastest(self, problem):
        t = self.timed.get(problem)
        return None if t is None else t.fastest()


def test_the_fastest_of_the_candidates_timed_together(tmp_path):
    """The shipped retime of Llama-3-8B at M=1: the gate projection ran fastest in a Triton
    template (32.5 us, ATen 34.0), the down projection on ATen (32.9 us, the pick 45.3); a
    quack config timed in the same rounds takes either where it ran faster still."""
    rows = shipped_rows()
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        rows[llama(1, GATE)], rows[llama(1, DOWN)], with_quack(rows[llama(4, DOWN)], 0.0300),
        {"m": 2, "n": 1, "k": 1, "majors": "kk", "error": "RuntimeError: boom"})))
    timed = dict(retimed_gpu_times(path))
    assert set(timed) == {llama(1, GATE), llama(1, DOWN), llama(4, DOWN)}
    kind, config = timed[llama(1, GATE)].fastest()
    fastest = min((r for r in load_retimed(RETIMED) if r.problem == llama(1, GATE)),
                  key=lambda r: r.triton_us)
    assert (kind, config) == ("triton", fastest.config)
    assert timed[llama(1, GATE)].aten_us == pytest.approx(fastest.aten_us)
    assert timed[llama(1, DOWN)].fastest() == ("aten", None)
    assert timed[llama(4, DOWN)].fastest() == ("quack", Q)
    assert timed[llama(4, DOWN)].quack == (Q, pytest.approx(30.0))
    # a tie keeps ATen; a quack config the rules reject for the problem is no candidate
    assert GpuTimed(10.0, ((16,) * 6, 10.0), (Q, 10.0)).fastest() == ("aten", None)
    split4 = KernelConfig(64, 128, True, 1, 1, False, 8, 4, False)
    assert not is_valid(split4, "sm90", llama(1, (4096, 128)))  # 2 K tiles for 4 splits
    odd = {"m": 1, "n": 4096, "k": 128, "majors": "kk", "dtype": "bf16", "device": "NVIDIA H200",
           "timed": {"aten": {"ms": 0.01}, "q": {"ms": 0.001, "quack_config": split4.to_dict()}}}
    path.write_text(json.dumps(odd))
    assert [t.quack for _, t in retimed_gpu_times(path)] == [None]
    # a quack variant is not read as a Triton config by the launch costs' loader
    path.write_text(json.dumps(with_quack(rows[llama(4, DOWN)], 0.0300)))
    assert {r.variant for r in load_retimed(path)} == set(rows[llama(4, DOWN)]["timed"]) - {"aten"}


def test_gpu_times_round_trip_through_the_heuristics_file(tmp_path):
    rows = shipped_rows()
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        rows[llama(1, GATE)], with_quack(rows[llama(4, DOWN)], 0.0300))))
    timed = dict(retimed_gpu_times(path))

    class OneConfigModel:
        def rank(self, problem, configs=None, top_k=None):
            return [(quack_default_config("sm90"), 1.0)]

        def prefers_cublas(self, problem, configs=None):
            return True

    h = hz.build(OneConfigModel(), "sm90", "bf16", grid=Grid(m=(1,), n=(64,), k=(64,)),
                 gpu_times=timed)
    saved = h.save(tmp_path / "h.json")
    loaded = hz.Heuristics.load(saved)
    assert loaded.gpu_times == {p.key(): t for p, t in timed.items()}
    assert loaded.gpu_fastest(llama(4, DOWN)) == ("quack", Q)
    assert loaded.gpu_fastest(llama(1, GATE))[0] == "triton"
    assert loaded.gpu_fastest(llama(16, GATE)) is None
    # a negative time is a corrupt file, not a pick
    d = json.loads(saved.read_text())
    d["gpu_times"][llama(1, GATE).key()][0] = -1.0
    with pytest.raises(ValueError, match="GPU times"):  # load() names the file
        hz.Heuristics._from_json(d, "x")
    # a quack index outside the file's configs (a negative one too) is a corrupt file
    d = json.loads(saved.read_text())
    entry = d["gpu_times"][llama(4, DOWN).key()]
    for bad in (-1, len(d["configs"]), "0"):
        entry[3] = bad
        with pytest.raises(ValueError, match="quack config index"):
            hz.Heuristics._from_json(d, "x")


def test_decide_under_cuda_graphs_takes_the_fastest_timed_candidate():
    """No host cost (host_bound_us 0): a timed problem gets its fastest candidate alone in
    both modes; an untimed one what the heuristics say. With host cost the timings decide
    nothing: the host-bound rule stands."""
    rows = shipped_rows()
    timed = {p: GpuTimed(r["timed"]["aten"]["ms"] * 1e3, None, None) for p, r in rows.items()}
    timed.update({llama(1, GATE): GpuTimed(34.0, ((16, 64, 128, 8, 5, 4), 32.5), (Q, 33.0)),
                  llama(4, DOWN): GpuTimed(33.3, None, (Q, 30.0))})
    h = TimedHeuristics(timed)
    for mode, k in (("predicted", 1), ("reduced", 5)):
        triton = idec.decide(llama(1, GATE), mode, h, k, 0.0)
        assert triton.leave and triton.aten and not triton.configs
        assert dict(triton.triton_config) == dict(zip(CONFIG_KEYS, (16, 64, 128, 8, 5, 4)))
        assert idec.decide(llama(4, DOWN), mode, h, k, 0.0) == idec.NodeDecision(
            (Q,), False, "GPU-timed fastest: quack")
        aten = idec.decide(llama(1, DOWN), mode, h, k, 0.0)
        assert (aten.configs, aten.aten, aten.leave) == ((), True, False)
        untimed = idec.decide(llama(256, DOWN), mode, h, k, 0.0)
        assert untimed.configs == (Q,) and untimed.reason in ("top-1", "top-5 + ATen")
        host = idec.decide(llama(1, GATE), mode, h, k, idec.QUACK_LAUNCH_HOST_US)
        assert host.reason.startswith("host-bound")
    # the SwiGLU fusion leaves an up projection that a Triton template runs fastest
    assert idec.decide_swiglu(llama(1, GATE), h, 0.0) is None


def test_a_capture_in_progress_counts_as_cuda_graphs(monkeypatch):
    assert not idec.under_cuda_graphs()
    assert idec.host_bound_us() == idec.QUACK_LAUNCH_HOST_US
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert idec.under_cuda_graphs() and idec.host_bound_us() == 0.0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not idec.under_cuda_graphs()
    with inductor_config.patch({"triton.cudagraphs": True}):
        assert idec.under_cuda_graphs()


def test_a_graph_under_cuda_graphs_is_not_weighed_for_host_time(monkeypatch):
    """Nor read: the SwiGLU pass and the lowering ask once per graph, and under CUDA graphs
    every node takes its own pick by GPU time."""
    class Weighing(TimedHeuristics):
        def triton_problems(self, gemms):
            return frozenset()

    read = []
    gemms = idec.graph_gemms
    monkeypatch.setattr(idec, "graph_gemms", lambda *a: read.append(a) or gemms(*a))
    h = Weighing({})
    assert idec.triton_takers(torch.fx.Graph(), "sm90", h) == ([], frozenset())
    assert len(read) == 1
    with inductor_config.patch({"triton.cudagraphs": True}):
        assert idec.triton_takers(torch.fx.Graph(), "sm90", h) == ([], None)
    assert len(read) == 1
