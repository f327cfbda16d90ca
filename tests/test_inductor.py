"""torch.compile integration: heuristics files, per-node decisions, Inductor's real mm/addmm/bmm
lowering on a fake CUDA device (CPU torch), installation and restore, env vars, feedback rows;
and on a GPU (``-m gpu``) compiled Llama MLPs in each mode and an FX-graph-cache reload."""

from __future__ import annotations

import json
import logging
import itertools
import math
import os
import pickle
import re
import textwrap
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor import ir
from torch._inductor import select_algorithm as sa
from torch._inductor.virtualized import V

from cutetune.tuner.inductor import decisions as idec
from cutetune.space.config import KernelConfig, quack_default_config
from cutetune.space.problem import GemmProblem, ProblemError
from cutetune.models import heuristics as hz
from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
from cutetune.errors import OutputError
from cutetune.tuner.kernels import problems
from cutetune.models import triton_mm as tmm
from cutetune.tuner.kernels import aot, launcher, helper as prefetch, quack_gemm
from cutetune.tuner.measure.executor import signature_class
from cutetune.tuner.inductor.passes import GemvPass, SwigluFusionPass
from cutetune.models.heuristics import Grid, Heuristics, HeuristicsError
from cutetune import settings
from cutetune.artifacts import sealed_json
from cutetune.tuner.inductor import template_cache

BF16, FP16 = torch.bfloat16, torch.float16
A = KernelConfig(128, 192, True, 2, 1, False, 8, 1, False)
B = KernelConfig(128, 128, False, 1, 1, True, 1, 1, False)
C = KernelConfig(64, 128, True, 1, 1, False, 8, 1, False)
SPLIT4 = KernelConfig(64, 128, True, 1, 1, False, 8, 4, False)


class FakeHeuristics:
    """Stands in for a heuristics file: fixed answer, records what it was asked."""

    def __init__(self, configs=(A, B, C), prefers_aten=False, digest="fake"):
        self.configs, self.prefers_aten, self.digest = tuple(configs), prefers_aten, digest
        self.asked: list[GemmProblem] = []

    def lookup(self, problem):
        self.asked.append(problem)
        return self.configs, self.prefers_aten


class FakeModel:
    """A cost model's interface (rank, prefers_cublas) with picks that depend on the exact
    shape, so tests can tell a grid cell's answer from an exact entry's."""

    TILES = (16, 32, 48, 64, 96, 128, 160)

    def rank(self, problem, configs=None, top_k=None):
        n = self.TILES[(problem.m + problem.n + problem.k) % len(self.TILES)]
        ranked = [(KernelConfig(128, n, True, 1, 1, False, 8, 1, False), 1.0), (A, 2.0), (B, 3.0)]
        return ranked[:top_k]

    def prefers_cublas(self, problem, configs=None):
        return problem.m <= 2


def P(m, n, k, **kw):
    return GemmProblem(m, n, k, **kw)


# ---------------------------------------------------------------- heuristics files
SMALL = Grid(m=(1, 64, 1024), n=(64, 4096), k=(64, 4096))


def test_build_lookup_grid_and_exact_entries():
    exact_p = P(3000, 4096, 4096)
    h = hz.build(FakeModel(), "sm90", "bf16", top_k=2, grid=SMALL, problems=[exact_p])
    model = FakeModel()
    on_grid = P(64, 4096, 64)
    assert h.lookup(on_grid) == ((model.rank(on_grid, top_k=2)[0][0], A), False)
    # 48 is nearer 64 than 1 in log space; N/K snap the same way
    assert h.lookup(P(48, 3000, 80)) == h.lookup(P(64, 4096, 64))
    assert h.lookup(P(1, 64, 64))[1] is True  # the model prefers cuBLAS there
    assert h.lookup(exact_p)[0][0] == model.rank(exact_p, top_k=1)[0][0]
    assert h.lookup(P(3008, 4096, 4096)) == h.lookup(P(1024, 4096, 4096))  # grid, not exact
    # every operand-major pair has its own cells
    assert h.lookup(P(64, 4096, 64, a_major="m", b_major="n"))[0][0] == \
        model.rank(P(64, 4096, 64), top_k=1)[0][0]
    with pytest.raises(HeuristicsError, match="sm90/bf16, not sm90/fp16"):
        h.lookup(P(64, 64, 64, dtype="fp16", out_dtype="fp16"))


def test_a_grid_of_unbatched_cells_prefers_cublas_for_a_batched_problem():
    """The nearest cell's configs stay candidates for reduced mode; predicted mode keeps
    cuBLAS. A recorded (exact) batched entry and a grid with batched cells answer as frozen."""
    exact_p = P(3000, 4096, 4096, batch=8)
    h = hz.build(FakeModel(), "sm90", "bf16", top_k=2, grid=SMALL, problems=[exact_p])
    batched = P(64, 4096, 64, batch=8)
    assert h.lookup(batched) == (h.lookup(P(64, 4096, 64))[0], True)
    assert h.lookup(exact_p) == (h.lookup(exact_p)[0], False)
    two = hz.build(FakeModel(), "sm90", "bf16", top_k=2,
                   grid=Grid(batch=(1, 8), m=(64,), n=(4096,), k=(64,)))
    assert h.lookup(P(64, 4096, 64))[1] is False and two.lookup(batched)[1] is False


def test_save_load_round_trip(tmp_path):
    h = hz.build(FakeModel(), "sm90", "bf16", top_k=3, grid=SMALL, problems=[P(3000, 64, 64)])
    path = h.save(tmp_path / "h.json")
    g = Heuristics.load(path)
    assert (g.arch, g.dtype, g.top_k, g.grid) == ("sm90", "bf16", 3, SMALL)
    assert g.configs == h.configs and g.cells == h.cells and g.exact == h.exact
    assert g.digest == h.digest
    for p in (P(1, 64, 64), P(700, 100 * 8, 2048), P(3000, 64, 64)):
        assert g.lookup(p) == h.lookup(p)


@pytest.mark.parametrize("edit, match", [
    (lambda d: "{not json", "corrupt"),
    (lambda d: {**d, "format": "other"}, "not a cutetune heuristics file"),
    (lambda d: {**d, "version": 99}, "version 99"),
    (lambda d: {**d, "config_fields": d["config_fields"][:-1]}, "config fields"),
    (lambda d: {**d, "cells": d["cells"][:-1]}, "cells for a grid"),
    (lambda d: {**d, "cells": [[0, 999]] + d["cells"][1:]}, "bad entry"),
    (lambda d: {**d, "arch": "sm80"}, "unsupported arch"),
    (lambda d: {k: v for k, v in d.items() if k != "grid"}, "corrupt"),
    (lambda d: {**d, "exact": []}, "corrupt"),
    (lambda d: {**d, "configs": [c[:-1] for c in d["configs"]]}, "configs need"),
])
def test_bad_files_give_clear_errors(tmp_path, edit, match):
    d = hz.build(FakeModel(), "sm90", "bf16", grid=SMALL).to_json()
    bad = edit(d)
    path = tmp_path / "bad.json"
    path.write_bytes(bad.encode() if isinstance(bad, str) else sealed_json(bad))
    with pytest.raises(HeuristicsError, match=match) as e:
        Heuristics.load(path)
    assert str(path) in str(e.value)


def _edit_config(i, value):
    def edit(d):
        d["configs"][0][i] = value
        return d
    return edit


@pytest.mark.parametrize("edit, match", [
    (_edit_config(slice(0, 2), [7, 13]), r"config #0 \(7x13.*breaks sm90_tile_m, sm90_tile_n"),
    (_edit_config(slice(3, 5), [3, 5]), r"config #0 \(.*_c3x5.*breaks cluster_shape"),
    (_edit_config(2, "yes"), "config #0 .*pingpong must be true or false, got 'yes'"),
    (_edit_config(0, 128.5), "config #0 .*tile_m must be an integer, got 128.5"),
    (lambda d: {**d, "top_k": -5}, "top_k must be a positive integer, got -5"),
    (lambda d: {**d, "arch": "sm100"},
     r"config #\d+ .* not a valid sm100 config.*sm100_no_pingpong"),
])
def test_sealed_files_with_invalid_configs_are_refused(tmp_path, edit, match):
    """A file with a matching checksum (re-sealed after an edit, or written by another tool)
    still serves only configs the rules allow on its arch: the entry is named."""
    d = edit(hz.build(FakeModel(), "sm90", "bf16", grid=SMALL).to_json())
    path = tmp_path / "bad.json"
    path.write_bytes(sealed_json(d))
    with pytest.raises(HeuristicsError, match=match) as e:
        Heuristics.load(path)
    assert str(path) in str(e.value)


def test_every_byte_of_a_heuristics_file_is_checked(tmp_path):
    """A byte changed anywhere (a stride across the whole file) is refused, naming the file:
    the checksum covers every byte, so no change is served silently."""
    path = hz.build(FakeModel(), "sm90", "bf16", grid=SMALL, problems=[P(3000, 64, 64)]
                    ).save(tmp_path / "h.json")
    raw = path.read_bytes()
    for pos in range(0, len(raw), max(1, len(raw) // 300)):
        bad = bytearray(raw)
        bad[pos] ^= (0x01, 0x20, 0x80)[pos % 3]
        path.write_bytes(bytes(bad))
        with pytest.raises(HeuristicsError, match=re.escape(str(path))):
            Heuristics.load(path)
    path.write_bytes(raw)
    assert Heuristics.load(path).lookup(P(3000, 64, 64))


def test_a_version_1_file_or_a_directory_gets_a_clear_error(tmp_path):
    d = {**hz.build(FakeModel(), "sm90", "bf16", grid=SMALL).to_json(), "version": 1}
    (tmp_path / "v1.json").write_text(json.dumps(d))
    with pytest.raises(HeuristicsError, match="format version 1; this cutetune reads version "
                                              "2 .*cutetune emit"):
        Heuristics.load(tmp_path / "v1.json")
    with pytest.raises(HeuristicsError, match=f"{tmp_path} is a directory; give the file"):
        Heuristics.load(tmp_path)


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="cutetune emit"):
        Heuristics.load(tmp_path / "none.json")


def test_packaged_heuristics(tmp_path, monkeypatch):
    monkeypatch.setattr(hz, "DATA_DIR", tmp_path)
    with pytest.raises(HeuristicsError, match="no packaged heuristics"):
        hz.PackagedHeuristics()
    hz.build(FakeModel(), "sm90", "bf16", grid=SMALL).save(hz.default_path("sm90", "bf16"))
    ph = hz.PackagedHeuristics()
    assert ph.lookup(P(64, 64, 64)) == Heuristics.load(tmp_path / "heuristics_sm90_bf16.json.gz") \
        .lookup(P(64, 64, 64))
    with pytest.raises(HeuristicsError, match="sm100/bf16"):
        ph.lookup(P(64, 64, 64, arch="sm100"))


def test_packaged_heuristics_ask_the_packaged_model_where_the_file_has_no_exact_entry(
        tmp_path, monkeypatch):
    """With a cost model beside the file, predicted mode's decision for a shape the file only
    has a grid cell for comes from the model asked for that shape; a recorded problem keeps
    the file's exact (measured) entry; without the model the grid answers."""
    import cutetune.models.artifact as art

    exact_p, unseen = P(3000, 4096, 4096), P(48, 3000, 80)
    monkeypatch.setattr(hz, "DATA_DIR", tmp_path)
    hz.build(FakeModel(), "sm90", "bf16", grid=SMALL, problems=[exact_p],
             measured={exact_p.key(): ((B,), False)}).save(hz.default_path("sm90", "bf16"))
    grid_only = hz.PackagedHeuristics()
    model_file = hz.model_path(tmp_path, "sm90", "bf16")
    model_file.write_bytes(b"model")
    monkeypatch.setattr(art, "load_model", lambda path, arch, dtype: FakeModel())
    ph = hz.PackagedHeuristics()
    assert ph.digest != grid_only.digest  # the model is in the compiled graphs' cache key
    want = FakeModel().rank(unseen, top_k=1)[0][0]
    assert grid_only.lookup(unseen)[0][0] != want  # the grid cell's (64, 4096, 64) pick
    assert ph.lookup(unseen)[0][0] == want
    assert idec.decide(unseen, "predicted", ph, 1).configs == (want,)
    assert idec.decide(P(2, 3000, 80), "predicted", ph, 1).reason == "the model prefers cuBLAS"
    assert ph.lookup(exact_p) == ((B,), False)
    assert hz.PackagedHeuristics(models=False).lookup(unseen) == grid_only.lookup(unseen)

    def broken(path, arch, dtype):
        raise art.ModelError("damaged")

    monkeypatch.setattr(art, "load_model", broken)
    assert hz.PackagedHeuristics().lookup(unseen) == grid_only.lookup(unseen)


def test_a_device_measured_apart_answers_from_its_own_folder(tmp_path, monkeypatch):
    """On a device with a folder of its own (cutetune/data/h100_sxm/), its file answers which
    config or cuBLAS for the pairs it holds; the arch's files answer its other pairs, and
    every pair on any other device. The device is asked once, at the first lookup."""
    monkeypatch.setattr(hz, "DATA_DIR", tmp_path)
    p, p16 = P(3000, 4096, 4096), P(3000, 4096, 4096, dtype="fp16", out_dtype="fp16")
    hz.build(FakeModel(), "sm90", "bf16", grid=SMALL, problems=[p],
             measured={p.key(): ((A,), False)}).save(hz.default_path("sm90", "bf16"))
    hz.build(FakeModel(), "sm90", "fp16", grid=SMALL, problems=[p16],
             measured={p16.key(): ((A,), False)}).save(hz.default_path("sm90", "fp16"))
    arch_only = hz.PackagedHeuristics()
    hz.build(FakeModel(), "sm90", "bf16", grid=SMALL, problems=[p],
             measured={p.key(): ((B,), True)}).save(tmp_path / "h100_sxm" / hz.default_path(
                 "sm90", "bf16").name)
    asked = []

    def h100():
        asked.append(1)
        return "NVIDIA H100 80GB HBM3"

    ph = hz.PackagedHeuristics(device=h100)
    assert ph.digest != arch_only.digest  # the device's files are in the cache key
    assert ph.lookup(p) == ((B,), True) and ph.lookup(p16) == ((A,), False)
    assert asked == [1]
    assert idec.decide(p, "predicted", ph, 1).reason == "the model prefers cuBLAS"
    for other in (None, "NVIDIA H200", "NVIDIA H100 PCIe"):  # the last: no spec, no guess
        assert hz.PackagedHeuristics(device=other).lookup(p) == ((A,), False)

    def no_cuda():
        raise RuntimeError("CUDA driver initialization failed")

    assert hz.PackagedHeuristics(device=no_cuda).lookup(p) == ((A,), False)


def test_predicted_mode_asks_the_running_gpus_name_for_its_own_heuristics(monkeypatch):
    """``enable()``'s default source takes the GPU's name from torch at its first lookup:
    on an H100 the shipped H100 folder answers, bf16 and fp16 each from its own model."""
    monkeypatch.setattr(iin, "cuda_device_name", lambda: "NVIDIA H100 80GB HBM3")
    installation = iin.enable("predicted")
    try:
        source = ich._SOURCES[installation.factory.source]
    finally:
        installation.disable()
    assert source._own is not None and source._own.folder.name == "h100_sxm"
    pairs = {("sm90", "bf16"), ("sm90", "fp16")}
    assert set(source._own.paths) == pairs == set(source._own.model_paths)


def test_the_shipped_predicted_source_ranks_unrecorded_shapes_with_the_shipped_model():
    """``enable("predicted")``'s default source: the shipped model's answer for a shape the
    shipped file has no exact entry for, the file's exact entry for a recorded one."""
    from cutetune.models.artifact import load_model

    installation = iin.enable("predicted")
    try:
        source = ich._SOURCES[installation.factory.source]
    finally:
        installation.disable()
    model, unseen = hz.ModelHeuristics(load_model()), P(3000, 5000, 6000)
    shipped = Heuristics.load(hz.default_path("sm90", "bf16"))
    assert shipped.exact_pick(unseen) is None
    assert source.lookup(unseen) == model.lookup(unseen)
    recorded = [GemmProblem.from_key(k) for k in shipped.exact]
    assert [source.lookup(p) for p in recorded] == [shipped.exact_pick(p) for p in recorded]
    assert any(shipped.exact_pick(p) != model.lookup(p) for p in recorded)
    # the fp16 model measured no batched GEMM: an fp16 bmm keeps cuBLAS, its ranking kept;
    # the bf16 one measured the bmm suite, so its fallback decides there
    bmm = P(4096, 4096, 128, batch=8, dtype="fp16", out_dtype="fp16")
    configs, aten = source.lookup(bmm)
    assert aten and configs and not load_model(dtype="fp16").measured_layout(bmm)
    bmm = P(3000, 5000, 6000, batch=3)
    assert shipped.exact_pick(bmm) is None and load_model().measured_layout(bmm)
    assert source.lookup(bmm) == model.lookup(bmm)


def test_cli_emit(tmp_path, monkeypatch):
    import cutetune.models
    from cutetune.cli import main
    from cutetune.models.dataset import append

    model_file = tmp_path / "model.bin"
    model_file.write_bytes(b"weights")
    calls = []

    def load_model(path=None, arch="sm90", dtype="bf16"):
        calls.append((str(path), arch, dtype))
        if not str(path).endswith("model.bin"):
            raise FileNotFoundError(f"no model at {path}")
        return FakeModel()

    monkeypatch.setattr(cutetune.models, "load_model", load_model, raising=False)
    ds = tmp_path / "ds"
    recorded = P(3000, 4096, 1024)
    append(ds, [{**recorded.to_dict(), "problem_key": recorded.key(), "backend": "cublas",
                 "status": "ok"}])
    out = tmp_path / "h.json"
    assert main(["emit", "--model", str(model_file), "--out", str(out), "--top-k", "2",
                 "--dataset", str(ds)]) == 0
    h = Heuristics.load(out)
    assert calls == [(str(model_file), "sm90", "bf16")] and h.top_k == 2
    assert recorded.key() in h.exact and h.grid == Grid()
    assert main(["emit", "--model", str(tmp_path / "nope"), "--out", str(out)]) == 2
    with pytest.raises(SystemExit):
        main(["emit", "--model", str(model_file), "--out", str(out), "--top-k", "0"])


def test_measured_picks_and_emit_use_measurements(tmp_path, monkeypatch):
    """Recorded problems take their measured top-k, and CuteDSL only when the best measured
    config beat cuBLAS by the margin; the model answers for the rest."""
    import cutetune.models
    from cutetune.cli import main
    from cutetune.models.dataset import append

    win, lose = P(3000, 4096, 1024), P(64, 4096, 1024)
    D = KernelConfig(64, 64, True, 1, 1, False, 1, 1, False)  # recorded as failed

    def rows(p, cublas_ms, times):
        out = [{**p.to_dict(), "problem_key": p.key(), "backend": "cublas", "status": "ok",
                "time_ms": cublas_ms}]
        out += [{**p.to_dict(), **c.to_dict(), "problem_key": p.key(), "backend": "quack",
                 "config_key": c.short(), "status": "ok", "time_ms": t}
                for c, t in zip((A, B, C), times)]
        return out + [{**p.to_dict(), **D.to_dict(), "problem_key": p.key(), "backend": "quack",
                       "config_key": D.short(), "status": "runtime_error", "time_ms": None}]

    recorded = rows(win, 1.0, [0.99, 0.90, 0.95]) + rows(lose, 1.0, [0.99, 0.98, 1.2])
    picks = hz.measured_picks(recorded, top_k=2, margin=0.05)
    assert picks[win.key()] == ((B, C), False)  # 10 % faster than cuBLAS: CuteDSL
    assert picks[lose.key()] == ((B, A), True)  # 2 % faster: inside the margin, ATen stays
    assert hz.measured_picks(recorded, top_k=2, margin=0.0)[lose.key()][1] is False

    monkeypatch.setattr(cutetune.models, "load_model", lambda *a, **k: FakeModel(),
                        raising=False)
    model_file = tmp_path / "model.bin"
    model_file.write_bytes(b"weights")
    append(tmp_path / "ds", recorded)
    out = tmp_path / "h.json"
    assert main(["emit", "--model", str(model_file), "--out", str(out), "--top-k", "2",
                 "--dataset", str(tmp_path / "ds"), "--exact-margin", "0.05"]) == 0
    h = Heuristics.load(out)
    assert h.lookup(win) == ((B, C), False) and h.lookup(lose) == ((B, A), True)
    assert h.meta["exact_margin"] == 0.05


# ---------------------------------------------------------------- decisions
def test_decide_modes():
    fake, p = FakeHeuristics(), P(512, 4096, 4096)
    assert idec.decide(p, "predicted", fake, 1) == idec.NodeDecision((A,), False, "top-1")
    d = idec.decide(p, "reduced", fake, 2)
    assert d.configs == (A, B) and d.aten
    d = idec.decide(p, "predicted", FakeHeuristics(prefers_aten=True), 1)
    assert d.configs == () and d.aten and "cuBLAS" in d.reason
    d = idec.decide(ProblemError("fp32"), "reduced", fake, 2)
    assert d.leave and not d.configs and "fp32" in d.reason
    assert idec.decide(p, "predicted", FakeHeuristics(prefers_aten=True), 1).leave is False


def test_decide_keeps_aten_for_gemms_shorter_than_a_quack_launch():
    """Llama-3-8B on an H200: the 4096^2 projections are host-bound at M=1 (7.8 us at its
    ceiling) and M=1024 (43.5 us), the MLP's at M=1 (27.3 us); the MLP at M=1024 (152 us) and
    the projections at M=4096 (174 us) are not. Reduced mode adds Triton templates where the
    GEMM is memory-bound: at M=1, not at M=1024, where they made the attention step slower
    (data/bench/step_h200_hostbound.json.gz)."""
    fake, limit = FakeHeuristics(), idec.QUACK_LAUNCH_HOST_US
    for mode, k in (("predicted", 1), ("reduced", 5)):
        for p, ideal, memory_bound in ((P(1, 4096, 4096), "7.8", True),
                                       (P(1024, 4096, 4096), "43.5", False),
                                       (P(1024, 1024, 4096), "10.9", False),
                                       (P(1, 14336, 4096), "27.3", True)):
            d = idec.decide(p, mode, fake, k, limit)
            triton = mode == "reduced" and memory_bound
            assert d == idec.NodeDecision((), True, d.reason, leave=True, triton=triton)
            assert d.reason.startswith("host-bound")
            assert f"{ideal} us" in d.reason
        for p in (P(1024, 14336, 4096), P(4096, 4096, 4096)):
            assert idec.decide(p, mode, fake, k, limit).configs
    assert idec.decide(P(1, 4096, 4096), "predicted", fake, 1, 0.0).configs == (A,)


def test_host_bound_limit_is_lifted_under_cuda_graphs():
    assert idec.host_bound_us() == idec.QUACK_LAUNCH_HOST_US
    with inductor_config.patch({"triton.cudagraphs": True}):
        assert idec.host_bound_us() == 0.0


def test_decide_drops_configs_invalid_for_the_problem():
    """A stale heuristics file must not hand quack a config its rules reject."""
    short_k = P(512, 4096, 128)  # 2 K tiles: split-K 4 has nothing to split
    d = idec.decide(short_k, "predicted", FakeHeuristics((SPLIT4, C)), 1)
    assert d.configs == (C,)
    d = idec.decide(short_k, "predicted", FakeHeuristics((SPLIT4,)), 1)
    assert d.leave and not d.configs


# ---------------------------------------------------------------- Inductor lowering (fake GPU)
@pytest.fixture
def fake_gpu(monkeypatch):
    """Lower for a CUDA device on CPU torch. CPU torch cannot read CUDA device properties:
    declaring the device "not big" only removes Triton templates from the candidate lists,
    and the arch stands in for torch.cuda.get_device_capability."""
    import torch._inductor.utils as iu

    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: False)
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    # the test shapes are small enough to be host-bound: lowering is tested without that rule
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 0.0)
    monkeypatch.setattr(sa.AlgorithmSelectorCache, "do_autotuning",
                        lambda *a, **k: pytest.fail("Inductor benchmarked the choices"))


def lower(fn, *specs, dynamic_m: bool = False):
    """Lower ``fn`` with Inductor's real lowerings; ``specs`` are (size, stride, dtype), the
    first one's first size symbolic with ``dynamic_m``. Returns (python_kernel_name, kwargs)
    of each extern kernel in the lowered graph."""
    from torch._dynamo.source import ConstantSource
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv() if dynamic_m else None
    mode = FakeTensorMode(shape_env=env)
    sizes = [size for size, _, _ in specs]
    if dynamic_m:
        m = sizes[0][0]
        sizes[0] = (env.create_symintnode(env.create_symbol(m, ConstantSource("m")), hint=m),
                    *sizes[0][1:])
    with mode:
        args = [torch.empty_strided(size, stride, dtype=dtype, device="cuda")
                for size, (_, stride, dtype) in zip(sizes, specs)]
        gm = make_fx(fn, tracing_mode="real" if dynamic_m else "fake",
                     decomposition_table=select_decomp_table())(*args)
    g = GraphLowering(gm, example_inputs=args, shape_env=env)
    with V.set_graph_handler(g), V.set_fake_mode(mode):
        g.run(*args)
    return [(op.python_kernel_name, dict(op.kwargs)) for op in g.operations
            if isinstance(op, ir.ExternKernelOut)]


def row(*size, dtype=BF16):
    stride = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        stride[i] = stride[i + 1] * size[i + 1]
    return tuple(size), tuple(stride), dtype


def block(x, w1, b1, w2, y):
    h = torch.nn.functional.linear(x, w1, b1).relu()  # addmm, transposed weight
    return h @ w2, torch.bmm(y, y)                     # mm, bmm


BLOCK = (row(64, 256), row(512, 256), row(512), row(512, 256), row(4, 64, 64))
MM, ADDMM = f"extern_kernels.{launcher.MM_KERNEL}", f"extern_kernels.{launcher.ADDMM_KERNEL}"


def test_predicted_gives_one_quack_choice_per_node(fake_gpu, monkeypatch):
    fake, imports = FakeHeuristics(), []
    monkeypatch.setattr(quack_gemm, "import_quack_in_background", lambda: imports.append(1))
    with iin.enable("predicted", model=fake):
        kernels = lower(block, *BLOCK)
    assert len(imports) == 3  # quack's import starts with the first node that chose it
    # with the mm's TVM-FFI library built, its node launches without quack: no import for it
    monkeypatch.setattr(aot, "can_link", lambda: True)
    key = prefetch.kernel_key(GemmProblem(64, 256, 512, b_major="n"), A)
    meta = aot.library_paths(key[1])[1]
    meta.parent.mkdir(parents=True)
    meta.write_text("{}")
    with iin.enable("predicted", model=FakeHeuristics()):
        assert lower(block, *BLOCK) == kernels
    assert len(imports) == 3 + 2  # the addmm's and the bmm's
    cfg = problems.config_tuple(A)
    assert kernels == [(ADDMM, {"config": cfg, "alpha": 1, "beta": 1}), (MM, {"config": cfg}),
                       (MM, {"config": cfg})]
    assert [(p.m, p.n, p.k, p.batch, p.a_major, p.b_major) for p in fake.asked] == [
        (64, 512, 256, 1, "k", "k"), (64, 256, 512, 1, "k", "n"), (64, 64, 64, 4, "k", "n")]


def test_predicted_falls_back_to_aten(fake_gpu, monkeypatch):
    with iin.enable("predicted", model=FakeHeuristics()):
        fp32 = lower(lambda a, b: a @ b, row(64, 256, dtype=torch.float32),
                     row(256, 64, dtype=torch.float32))
        odd_k = lower(lambda a, b: a @ b, row(64, 100), row(100, 64))
    imports = []
    monkeypatch.setattr(quack_gemm, "import_quack_in_background", lambda: imports.append(1))
    with iin.enable("predicted", model=FakeHeuristics(prefers_aten=True)):
        cublas = lower(lambda a, b: a @ b, row(64, 256), row(256, 64))
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)  # the rule fake_gpu lifts
    with iin.enable("predicted", model=FakeHeuristics()):
        host_bound = lower(lambda a, b: a @ b, row(64, 256), row(256, 64))
    assert imports == []  # no quack kernel chosen: quack is not imported
    monkeypatch.setattr(problems, "device_arch", lambda device: None)  # e.g. an A100
    with iin.enable("predicted", model=FakeHeuristics()):
        other_gpu = lower(lambda a, b: a @ b, row(64, 256), row(256, 64))
    for kernels in (fp32, odd_k, cublas, host_bound, other_gpu):
        assert kernels == [("extern_kernels.mm", {})]


def test_a_dynamic_m_gets_one_choice_with_a_config_per_range_of_m(fake_gpu, monkeypatch):
    """An mm or addmm whose M is dynamic gets, in either mode, one choice (not benchmarked:
    ``fake_gpu`` fails a test that benchmarks) running ATen for the M where the GEMM is
    host-bound and the heuristics' top-1 above; where the model prefers cuBLAS at every M, or
    a size other than M is dynamic, Inductor's ATen stands."""
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)
    specs = (row(64, 4096), row(4096, 4096), row(4096))
    by_m = [f"extern_kernels.{launcher.MM_BY_M_KERNEL}",
            f"extern_kernels.{launcher.ADDMM_BY_M_KERNEL}"]
    for mode in ("predicted", "reduced"):
        with iin.enable(mode, model=FakeHeuristics()):
            kernels = lower(lambda a, w, bias: (a @ w, torch.addmm(bias, a, w)), *specs,
                            dynamic_m=True)
        assert [name for name, _ in kernels] == by_m
        (m_aten, aten), (m_last, top1) = kernels[0][1]["table"]
        assert kernels[1][1] == {"table": kernels[0][1]["table"], "alpha": 1, "beta": 1}
        assert aten is None and top1 == problems.config_tuple(A)
        assert m_last == launcher.M_UNBOUNDED
        rung = 2 ** (m_aten.bit_length() - 1)  # the last rung of the ATen range
        assert m_aten == math.isqrt(2 * rung * rung)
        assert tmm.host_bound(P(rung, 4096, 4096), 48.0) is not None
        assert tmm.host_bound(P(2 * rung, 4096, 4096), 48.0) is None
    with iin.enable("predicted", model=FakeHeuristics(prefers_aten=True)):
        assert lower(lambda a, w: a @ w, *specs[:2], dynamic_m=True) == [
            ("extern_kernels.mm", {})]
    with iin.enable("predicted", model=FakeHeuristics()):  # A column-major: its stride is M
        assert lower(lambda a, w: a.t() @ w, row(4096, 64), row(4096, 4096),
                     dynamic_m=True) == [("extern_kernels.mm", {})]


def test_the_by_m_kernels_run_the_range_that_holds_m():
    table = ((4, None), (launcher.M_UNBOUNDED, problems.config_tuple(A)))
    assert [launcher.config_for_m(table, m) for m in (1, 4, 5, 10 ** 9)] == [
        None, None, table[1][1], table[1][1]]
    for m in (3, 8):  # CPU tensors: ATen either way, through both paths
        a, b, bias = torch.randn(m, 16), torch.randn(16, 4), torch.randn(4)
        out = torch.empty(m, 4)
        torch.testing.assert_close(launcher._cutetune_quack_mm_by_m(a, b, out=out, table=table),
                                   a @ b)
        torch.testing.assert_close(
            launcher._cutetune_quack_addmm_by_m(bias, a, b, out=out, table=table, beta=0.5),
            torch.addmm(bias, a, b, beta=0.5))
    assert launcher.m_ranges(lambda m: m >= 64) == (
        (45, False), (launcher.M_UNBOUNDED, True))  # 45 * 45 <= 2 * 32 * 32 < 46 * 46


def test_off_and_no_installation_leave_inductor_alone(fake_gpu):
    with iin.enable("off"):
        assert lower(lambda a, b: a @ b, row(64, 256), row(256, 64)) == [("extern_kernels.mm", {})]


def test_reduced_offers_top_k_and_aten(fake_gpu):
    seen = []

    def record(choices):  # keep one so the CPU does not try to benchmark CUDA kernels
        seen.append(list(choices))
        return choices[:1]

    cache = sa.get_algorithm_selector_cache()
    cache.add_preprocessing_fn(record)
    try:
        with iin.enable("reduced", top_k=2, model=FakeHeuristics()):
            lower(block, *BLOCK)
    finally:
        cache.preprocessing_fns.remove(record)
    assert len(seen) == 3
    for choices in seen:
        names = [c.choice.name for c in choices]
        ours = [c for c in choices if c.choice.name.startswith("cutetune")]
        assert names[0] in ("mm", "addmm", "bmm")  # ATen first (Inductor's deterministic pick)
        assert [c.kwargs["config"] for c in ours] == [problems.config_tuple(A),
                                                      problems.config_tuple(B)]
        assert [c.description for c in ours] == [A.short(), B.short()]


def test_reduced_offers_triton_templates_for_host_bound_mm(fake_gpu, monkeypatch):
    """A host-bound mm in reduced mode gets Inductor's Triton mm template beside ATen, generated
    as under max-autotune; predicted mode and other ops keep ATen alone. CPU torch cannot
    generate Triton choices, so the stand-in records what Inductor was asked and answers with
    the extern templates only."""
    import torch._inductor.utils as iu
    from torch._inductor.choices import InductorChoices
    from torch._inductor.kernel.mm import mm_template

    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: True)
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)
    asked, original = [], InductorChoices.get_template_configs

    def stand_in(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        asked.append((op_name, [t.uid for t in templates], inductor_config.max_autotune_gemm))
        externs = [t for t in templates if isinstance(t, sa.ExternKernelChoice)]
        return original(self, kernel_inputs, externs, op_name, kwarg_overrides)

    monkeypatch.setattr(InductorChoices, "get_template_configs", stand_in)
    for mode in ("reduced", "predicted"):
        with iin.enable(mode, model=FakeHeuristics()):
            kernels = lower(block, *BLOCK)
        assert [name for name, _ in kernels] == [
            "extern_kernels.addmm", "extern_kernels.mm", "extern_kernels.bmm"]
    reduced, predicted = asked[:3], asked[3:]
    assert [(op, mm_template.uid in uids, mag) for op, uids, mag in reduced] == [
        ("addmm", False, False), ("mm", True, True), ("bmm", False, False)]
    assert all(mm_template.uid not in uids and not mag for _, uids, mag in predicted)
    assert not inductor_config.max_autotune_gemm  # the patch is lifted after generation
    asked.clear()
    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: False)  # no Triton templates there
    with iin.enable("reduced", model=FakeHeuristics()):
        lower(lambda a, b: a @ b, row(64, 256), row(256, 64))
    assert asked == [("mm", ["aten::mm"], False)]


class TritonHeuristics(FakeHeuristics):
    """FakeHeuristics with a Triton table's answer for every problem."""

    CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 5,
              "num_warps": 4}

    def triton_config(self, problem, measured_only=False):
        return None if measured_only else self.CONFIG


def test_predicted_asks_for_the_heuristics_triton_config_alone(fake_gpu, monkeypatch):
    """Predicted mode asks Inductor for the Triton mm template alone, under max-autotune's
    settings, keeping only the heuristics' config, from the default list and then from the
    exhaustive one; CPU torch generates no Triton choice, so the node falls back to ATen, as
    it does wherever Inductor does not offer that config. Reduced mode asks for ATen and the
    whole default Triton list."""
    import torch._inductor.utils as iu
    from torch._inductor.choices import InductorChoices
    from torch._inductor.kernel.mm import mm_template

    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: True)
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)
    asked, original = [], InductorChoices.get_template_configs

    def stand_in(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        asked.append(([t.uid for t in templates], inductor_config.max_autotune_gemm,
                      inductor_config.max_autotune_gemm_search_space, self._keep_only))
        externs = [t for t in templates if isinstance(t, sa.ExternKernelChoice)]
        return original(self, kernel_inputs, externs, op_name, kwarg_overrides)

    monkeypatch.setattr(InductorChoices, "get_template_configs", stand_in)
    space = inductor_config.max_autotune_gemm_search_space
    only = TritonHeuristics.CONFIG
    for mode, want in (("predicted", [([mm_template.uid], True, "DEFAULT", only),
                                       ([mm_template.uid], True, "EXHAUSTIVE", only),
                                       (["aten::mm"], False, space, None)]),
                       ("reduced", [(["aten::mm", mm_template.uid], True, "DEFAULT", None)])):
        asked.clear()
        with iin.enable(mode, model=TritonHeuristics()):
            kernels = lower(lambda a, b: a @ b, row(16, 1024), row(1024, 1024))
        assert [name for name, _ in kernels] == ["extern_kernels.mm"]
        assert asked == want


class GraphTritonHeuristics(TritonHeuristics):
    """TritonHeuristics whose ``triton_problems`` gives the Triton config to the problems with
    an N in ``takers``, recording each graph's question (the shapes of its mm that have a
    Triton config)."""

    def __init__(self, takers: tuple[int, ...]):
        super().__init__(digest=f"graph-triton-{takers}")
        self.takers, self.graphs = takers, []

    def triton_problems(self, gemms):
        self.graphs.append([(p.m, p.n, p.k, dict(c)) for p, c in gemms])
        return frozenset(p for p, _ in gemms if p.n in self.takers)


def test_a_graphs_mm_get_triton_templates_only_where_its_step_gains(fake_gpu, monkeypatch):
    """A graph's host-bound mm are weighed together, once per graph (``triton_problems``):
    a node whose problem the heuristics keep on ATen does not ask for the Triton template and
    stays on ATen, in either mode. A node they give Triton asks for it; in reduced mode for the
    template's configs without ATen (CPU torch offers none, so ATen is asked next, as on a GPU
    where Inductor has no Triton config for the node); heuristics that cannot weigh a graph
    (TritonHeuristics, the test above) get ATen beside them."""
    import torch._inductor.utils as iu
    from torch._inductor.choices import InductorChoices
    from torch._inductor.kernel.mm import mm_template

    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: True)
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)
    asked, original = [], InductorChoices.get_template_configs

    def stand_in(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        asked.append([t.uid for t in templates])
        externs = [t for t in templates if isinstance(t, sa.ExternKernelChoice)]
        return original(self, kernel_inputs, externs, op_name, kwarg_overrides)

    monkeypatch.setattr(InductorChoices, "get_template_configs", stand_in)
    config = TritonHeuristics.CONFIG
    aten = [["aten::mm"]]
    for mode in ("predicted", "reduced"):
        # predicted mode asks for the config, in the default list and then the exhaustive one;
        # reduced mode for the default list (the config was not retimed)
        triton = [[mm_template.uid]] * (2 if mode == "predicted" else 1) + aten
        for takers, want in (((1024, 2048), triton * 2), ((), aten * 2),
                             ((2048,), aten + triton)):
            asked.clear()
            h = GraphTritonHeuristics(takers)
            with iin.enable(mode, model=h, prefetch=False):
                kernels = lower(lambda a, b, c: (a @ b, a @ c), row(16, 1024), row(1024, 1024),
                                row(1024, 2048))
            assert h.graphs == [[(16, 1024, 1024, config), (16, 2048, 1024, config)]]
            assert asked == want, (mode, takers)
            assert [name for name, _ in kernels] == ["extern_kernels.mm"] * 2


def test_reduced_keeps_aten_behind_triton_templates_benchmarked_without_it(
        fake_gpu, tmp_path, monkeypatch):
    """Where a graph gives a host-bound mm the Triton templates and reduced mode benchmarks them
    without ATen, ATen stays behind them as a LastResortCaller: ranked last without running
    (no tensors needed), under a cache key of its own, left out of feedback, and lowered as
    ATen's mm where it is taken (on a GPU, when every template failed)."""
    import torch._inductor.utils as iu
    from torch._inductor.choices import InductorChoices
    from torch._inductor.kernel.mm import mm_template

    monkeypatch.setattr(iu, "is_big_gpu", lambda *a, **k: True)
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 48.0)
    original = InductorChoices.get_template_configs
    template = FakeTritonChoice("triton_mm_0", **TritonHeuristics.CONFIG)

    def stand_in(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        if [t.uid for t in templates] == [mm_template.uid]:
            return [template]  # CPU torch generates no Triton choice
        return original(self, kernel_inputs, templates, op_name, kwarg_overrides)

    monkeypatch.setattr(InductorChoices, "get_template_configs", stand_in)
    seen, cache = [], sa.get_algorithm_selector_cache()
    cache.add_preprocessing_fn(lambda cs: seen.append(list(cs)) or cs[-1:])
    try:
        with iin.enable("reduced", model=GraphTritonHeuristics((1024,)), prefetch=False):
            kernels = lower(lambda a, b: a @ b, row(16, 1024), row(1024, 1024))
    finally:
        cache.preprocessing_fns.pop()
    (choices,) = seen
    assert [type(c) for c in choices] == [FakeTritonChoice, ich.LastResortCaller]
    last = choices[1]
    assert last.benchmark(out=None) == ich.LastResortCaller.RANK_MS
    assert last.choice.name == "mm"
    aten = sa.ExternKernelCaller(last.choice, last.input_nodes, last.layout, last.kwargs)
    assert last.hash_key().startswith(aten.hash_key()) and last.hash_key() != aten.hash_key()
    assert [name for name, _ in kernels] == ["extern_kernels.mm"]

    monkeypatch.setattr(ifb, "environment", lambda: {"device_name": "NVIDIA H200",
                                                    "torch_version": "2.x", "host": "x"})
    ifb.FeedbackRecorder(tmp_path / "fb")({template: 0.010, last: last.RANK_MS}, "mm",
                                         last.input_nodes, choices, None, {})
    (line,) = (tmp_path / "fb" / ifb.TRITON_FEEDBACK).read_text().splitlines()
    assert [c["name"] for c in json.loads(line)["choices"]] == ["triton_mm_0"]


def test_packaged_triton_configs_are_in_inductors_lists():
    """Every Triton config the packaged heuristics give the benchmark's host-bound GEMMs
    (Llama-3-8B's MLP and attention projections at M 1, 16 and 128) is one that this torch's
    Inductor generates for the shape, in its default or its exhaustive list, which predicted
    mode searches in that order; a config in neither would silently leave the node on ATen."""
    from torch._inductor.graph import GraphLowering
    from torch._inductor.kernel.mm import mm_template
    from torch._inductor.template_heuristics.registry import get_template_heuristic

    from cutetune.models.heuristics import PackagedHeuristics

    h = PackagedHeuristics()
    heuristic = get_template_heuristic(mm_template.uid, "cuda", "mm")
    asked = 0
    with V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))):
        for m in (1, 16, 128):
            for n, k in ((14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096)):
                want = h.triton_config(P(m, n, k))
                if want is None:
                    continue
                asked += 1
                offered = [{**c.kwargs, "num_stages": c.num_stages, "num_warps": c.num_warps}
                           for gen in (heuristic.get_mm_configs(),
                                       heuristic.get_exhaustive_mm_configs())
                           for c in gen(m, n, k, dtype_size=2, op_name="mm")]
                assert any(all(c.get(key) == v for key, v in want.items()) for c in offered), \
                    (m, n, k, want)
    assert asked == 12


def test_finalize_keeps_only_the_asked_triton_config():
    from types import SimpleNamespace

    choices = ich.ChoicesFactory("predicted", 1, iin._resolve_source(FakeHeuristics()))()
    ktc = lambda **kw: SimpleNamespace(params=SimpleNamespace(to_kwargs=lambda: {  # noqa: E731
        **TritonHeuristics.CONFIG, "EVEN_K": True, **kw}))
    offered = [ktc(BLOCK_N=32), ktc(), ktc(num_warps=8)]
    finalize = lambda: choices._finalize_template_configs(  # noqa: E731
        {"triton::mm": iter(offered)}, object(), [], "mm")
    assert finalize() == offered  # nothing asked: Inductor's list as it is
    choices._keep_only = TritonHeuristics.CONFIG
    assert finalize() == [offered[1]]
    choices._keep_only = {**TritonHeuristics.CONFIG, "BLOCK_K": 64}
    assert finalize() == []


def test_reduced_leaves_unsupported_nodes_to_inductor(fake_gpu):
    seen = []
    cache = sa.get_algorithm_selector_cache()
    cache.add_preprocessing_fn(lambda cs: seen.append([c.choice.name for c in cs]) or cs[:1])
    try:
        with iin.enable("reduced", top_k=2, model=FakeHeuristics()):
            lower(lambda a, b: a @ b, row(64, 256, dtype=torch.float32),
                  row(256, 64, dtype=torch.float32))
    finally:
        cache.preprocessing_fns.pop()
    assert seen == [["mm"]]


def reduced_mm_choices(m: int, top_k: int) -> list:
    """The choices reduced mode gives an (m x 256) @ (256 x 512) mm, as Inductor's
    preprocessing hook sees them (only the first is kept, so nothing is benchmarked)."""
    seen = []
    cache = sa.get_algorithm_selector_cache()
    cache.add_preprocessing_fn(lambda cs: seen.append(list(cs)) or cs[:1])
    try:
        with iin.enable("reduced", top_k=top_k, model=FakeHeuristics()):
            lower(lambda a, b: a @ b, row(m, 256), row(256, 512))
    finally:
        cache.preprocessing_fns.pop()
    return seen[0]


def test_feedback_rows_from_inductor_timings(fake_gpu, tmp_path, monkeypatch):
    choices = reduced_mm_choices(64, top_k=2)
    monkeypatch.setattr(ifb, "environment", lambda: {"device_name": "test", "host": "x"})
    timings = {choices[0]: 0.010, choices[1]: 0.008, choices[2]: float("inf")}
    rec = ifb.FeedbackRecorder(tmp_path / "fb")
    rec(timings, "mm", choices[0].input_nodes, choices, None, {})
    rec(timings, "mm", choices[0].input_nodes, choices, None, {})  # cached replay: no new rows
    rec(timings, "convolution", choices[0].input_nodes, choices, None, {})  # not ours
    from cutetune.models.dataset import load

    rows = sorted(load(tmp_path / "fb").to_pylist(), key=lambda r: r["backend"])
    # as recorded, to the float32 a dataset part stores
    assert [(r["backend"], r["config_key"], r["status"], r["time_ms"]) for r in rows] == [
        ("cublas", "", "ok", float(np.float32(0.010))),
        ("quack", A.short(), "ok", float(np.float32(0.008))),
        ("quack", B.short(), "runtime_error", None)]
    assert {r["suite"] for r in rows} == {ifb.FEEDBACK_SUITE}
    assert rows[1]["problem_key"] == P(64, 512, 256, b_major="n").key()
    assert rows[1]["tile_n"] == A.tile_n and rows[0]["tile_n"] is None


class FakeTritonChoice(sa.TritonTemplateCaller):
    """A Triton mm template choice as the feedback saver sees it (CPU torch cannot generate
    real ones): a name and the KernelTemplateChoice annotation holding its config."""

    def __init__(self, name: str, **config) -> None:  # no ChoiceCaller state needed here
        from types import SimpleNamespace

        self.name, self.description = name, ""
        self.annotations = {"ktc": SimpleNamespace(
            params=SimpleNamespace(to_kwargs=lambda: {**config, "EVEN_K": True}),
            template=SimpleNamespace(uid="triton::mm"))}


def test_feedback_appends_triton_sweep_rows(fake_gpu, tmp_path, monkeypatch):
    """A host-bound mm's benchmark of ATen and Triton templates becomes one Triton sweep row
    in the feedback folder, which load_sweep (and so `cutetune emit --triton-sweep`) reads."""
    from cutetune.models.triton_mm import load_sweep

    aten = next(c for c in reduced_mm_choices(16, top_k=1) if c.choice.name == "mm")
    monkeypatch.setattr(ifb, "environment", lambda: {"device_name": "NVIDIA H200",
                                                    "torch_version": "2.x", "host": "x"})
    x = FakeTritonChoice("triton_mm_0", **TritonHeuristics.CONFIG)
    y = FakeTritonChoice("triton_mm_1", **{**TritonHeuristics.CONFIG, "BLOCK_N": 32})
    timings = {aten: 0.020, x: 0.010, y: float("inf")}
    rec = ifb.FeedbackRecorder(tmp_path / "fb")
    rec(timings, "mm", aten.input_nodes, list(timings), None, {})
    rec(timings, "mm", aten.input_nodes, list(timings), None, {})  # cached replay: no new row
    rec({aten: 0.02}, "mm", aten.input_nodes, [aten], None, {})  # no Triton choice: no row
    again = ifb.FeedbackRecorder(tmp_path / "fb")  # another process's replay: no new row either
    again(timings, "mm", aten.input_nodes, list(timings), None, {})
    (shape,) = load_sweep(tmp_path / "fb" / ifb.TRITON_FEEDBACK)
    assert (shape.m, shape.n, shape.k, shape.majors, shape.device) == (16, 512, 256, "kn",
                                                                       "NVIDIA H200")
    assert shape.aten_ms == 0.020
    assert shape.triton_ms == {tuple(TritonHeuristics.CONFIG.values()): 0.010}  # inf: failed


# ---------------------------------------------------------------- installation
def test_enable_installs_and_restores():
    prev_class = inductor_config.inductor_choices_class
    prev_handler = V.choices  # builds this thread's handler, as a compile would
    with iin.enable("predicted", model=FakeHeuristics()) as inst:
        assert isinstance(inductor_config.inductor_choices_class, ich.ChoicesFactory)
        assert isinstance(V.choices, ich.CuteTuneChoices) and V.choices.mode == "predicted"
        with iin.enable("reduced", top_k=3, model=FakeHeuristics()):
            assert (V.choices.mode, V.choices.top_k) == ("reduced", 3)
            with iin.enable("off"):
                assert inductor_config.inductor_choices_class is None
                assert not isinstance(V.choices, ich.CuteTuneChoices)
            assert V.choices.mode == "reduced"
        assert V.choices.mode == "predicted"
    assert not inst.active
    assert inductor_config.inductor_choices_class is prev_class
    assert V.choices is prev_handler
    inst = iin.enable("predicted", model=FakeHeuristics())  # function style
    assert isinstance(V.choices, ich.CuteTuneChoices)
    inst.disable()
    inst.disable()
    assert V.choices is prev_handler


def _installed() -> tuple:
    """Everything an installation replaces, as a comparable tuple."""
    cache = sa.get_algorithm_selector_cache()
    return (inductor_config.inductor_choices_class, inductor_config.post_grad_custom_post_pass,
            inductor_config.pre_grad_custom_pass, os.environ.get(template_cache.ENV),
            ich._prefetch_for, list(cache.preprocessing_fns), list(cache.feedback_saver_fns))


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_installations_disabled_in_any_order_restore_everything(tmp_path, order):
    """Three overlapping installations, disabled in every order (creation order included):
    while some are active the last one decides, and at the end all is as before."""
    before, handler = _installed(), V.choices
    insts = [iin.enable("predicted", model=FakeHeuristics()),
             iin.enable("reduced", top_k=3, model=FakeHeuristics(), prefetch=lambda arch: None,
                        feedback=tmp_path / "fb"),
             iin.enable("off")]
    for i in order:
        insts[i].disable()
        active = [x for x in insts if x.active]
        if active and active[-1].factory is not None:
            assert inductor_config.inductor_choices_class is active[-1].factory
            assert V.choices.mode == active[-1].factory.mode
        elif active:
            assert inductor_config.inductor_choices_class is None
    assert _installed() == before and V.choices is handler


def test_mode_names_follow_one_rule():
    """CUTETUNE_MODE and enable(mode=...) read mode names alike: any case, spaces ignored."""
    import cutetune

    assert settings.parse_mode(" Predicted ") == "predicted"
    assert settings.compile_mode({"CUTETUNE_MODE": "Predicted"}) == "predicted"
    with iin.enable("Predicted", model=FakeHeuristics()) as inst:
        assert inst.factory.mode == "predicted"
    with cutetune.enable("REDUCED", top_k=2, model=FakeHeuristics(), prefetch=False) as inst:
        assert inst.factory.mode == "reduced"
    with pytest.raises(ValueError, match="unknown cutetune mode 'Fast'"):
        iin.enable("Fast")


def test_feedback_saver_added_and_removed(tmp_path):
    savers = sa.get_algorithm_selector_cache().feedback_saver_fns
    n = len(savers)
    with iin.enable("reduced", model=FakeHeuristics(), feedback=tmp_path / "fb") as inst:
        assert savers[-1] is inst.feedback and len(savers) == n + 1
    assert len(sa.get_algorithm_selector_cache().feedback_saver_fns) == n
    (tmp_path / "file").write_text("x")  # named at enable, not at Inductor's first benchmark
    prev = inductor_config.inductor_choices_class
    with pytest.raises(OutputError, match=f"feedback dataset folder {tmp_path / 'file'} is a "
                                          "file; give a folder"):
        iin.enable("reduced", model=FakeHeuristics(), feedback=tmp_path / "file")
    assert len(savers) == n and inductor_config.inductor_choices_class is prev


@pytest.mark.parametrize("kwargs, error, match", [
    ({"mode": "fast"}, ValueError, "unknown cutetune mode"),
    ({"mode": "reduced", "top_k": 0}, ValueError, "positive integer"),
    ({"mode": "predicted", "top_k": 3}, ValueError, "reduced mode"),
    ({"mode": "predicted", "feedback": "x"}, ValueError, "only reduced mode"),
    ({"mode": "predicted", "model": 42}, TypeError, "heuristics file path"),
    ({"mode": "predicted", "model": "/nonexistent/h.json"}, FileNotFoundError, "cutetune emit"),
])
def test_enable_rejects_bad_arguments(kwargs, error, match):
    prev = inductor_config.inductor_choices_class
    with pytest.raises(error, match=match):
        iin.enable(**kwargs)
    assert inductor_config.inductor_choices_class is prev


def test_uuid_and_cache_key_follow_mode_k_and_heuristics():
    u = lambda *a: ich.ChoicesFactory(*a)().uuid()  # noqa: E731
    ich._SOURCES.setdefault("d1", FakeHeuristics(digest="d1"))
    ich._SOURCES.setdefault("d2", FakeHeuristics(digest="d2"))
    assert len({u("predicted", 1, "d1"), u("reduced", 4, "d1"), u("reduced", 2, "d1"),
                u("predicted", 1, "d2")}) == 4
    assert u("predicted", 1, "d1") == u("predicted", 1, "d1")
    assert u("predicted", 1, "d1").endswith(ich.decision_code_digest())  # cutetune's own code
    assert ich.ChoicesFactory("reduced", 4, "d1").code == ich.decision_code_digest()
    # torch 2.11 pickles the factory into the FX-graph cache key: equal factories, equal bytes
    assert pickle.dumps(ich.ChoicesFactory("reduced", 4, "d1")) == \
        pickle.dumps(ich.ChoicesFactory("reduced", 4, "d1"))
    with iin.enable("reduced", top_k=2, model=FakeHeuristics(digest="d3")):
        portable = inductor_config.save_config_portable()
        value = portable["inductor_choices_class"]
        if "inductor_choices_class" in getattr(inductor_config, "_cache_config_factory_keys", []):
            assert value == u("reduced", 2, "d3")  # torch >= 2.13 asks uuid()
        else:
            assert value == ich.ChoicesFactory("reduced", 2, "d3")


def test_factory_without_loaded_heuristics_explains():
    with pytest.raises(RuntimeError, match="enable"):
        ich.ChoicesFactory("predicted", 1, "never-loaded")()


def _write_heuristics(tmp_path) -> str:
    return str(hz.build(FakeModel(), "sm90", "bf16", grid=SMALL).save(tmp_path / "h.json"))


def test_enable_from_env(tmp_path):
    path = _write_heuristics(tmp_path)
    prev = inductor_config.inductor_choices_class
    assert iin.enable_from_env({}) is None
    assert iin.enable_from_env({"CUTETUNE_MODE": "OFF", "CUTETUNE_TOPK": "3"}) is None
    assert inductor_config.inductor_choices_class is prev
    with iin.enable_from_env({"CUTETUNE_MODE": "predicted", "CUTETUNE_MODEL": path}) as inst:
        assert inst.factory.mode == "predicted" and inst.factory.top_k == 1
        assert inst.factory.source == Heuristics.load(path).digest
        assert isinstance(inductor_config.post_grad_custom_post_pass.user_pass, SwigluFusionPass)
    with iin.enable_from_env({"CUTETUNE_MODE": "predicted", "CUTETUNE_MODEL": path,
                             "CUTETUNE_FUSE_SWIGLU": "0"}):
        gemv = inductor_config.post_grad_custom_post_pass.user_pass  # grouped, then GEMV
        assert isinstance(gemv, GemvPass) and gemv.user_pass is None and gemv.tune
    with iin.enable_from_env({"CUTETUNE_MODE": "predicted", "CUTETUNE_MODEL": path,
                             "CUTETUNE_FUSE_SWIGLU": "0", "CUTETUNE_TUNE_GEMV": "0"}):
        untuned = inductor_config.post_grad_custom_post_pass.user_pass
        assert not untuned.tune and untuned.uuid() != gemv.uuid()  # apart in the FX cache
    with iin.enable_from_env({"CUTETUNE_MODE": "reduced", "CUTETUNE_TOPK": "3",
                             "CUTETUNE_MODEL": path,
                             "CUTETUNE_FEEDBACK": str(tmp_path / "fb")}) as inst:
        assert inst.factory.top_k == 3 and inst.feedback is not None
    assert inductor_config.inductor_choices_class is prev
    with pytest.raises(ValueError, match="CUTETUNE_MODE='fast'"):
        iin.enable_from_env({"CUTETUNE_MODE": "fast"})
    with pytest.raises(ValueError, match="CUTETUNE_TOPK='four'"):
        iin.enable_from_env({"CUTETUNE_MODE": "reduced", "CUTETUNE_TOPK": "four"})
    with pytest.raises(ValueError, match="CUTETUNE_FUSE_SWIGLU='yes'"):
        iin.enable_from_env({"CUTETUNE_MODE": "predicted", "CUTETUNE_FUSE_SWIGLU": "yes"})
    with pytest.raises(ValueError, match="CUTETUNE_TUNE_GEMV='no'"):
        iin.enable_from_env({"CUTETUNE_MODE": "predicted", "CUTETUNE_TUNE_GEMV": "no"})


def test_enable_takes_unset_arguments_from_the_environment(tmp_path, monkeypatch):
    """A deployment's switch (CUTETUNE_TUNE_GEMV=0 and the like) holds when code calls
    enable() itself; an argument given wins; TOPK and FEEDBACK serve reduced mode only."""
    path = _write_heuristics(tmp_path)
    for name, value in {"CUTETUNE_MODEL": path, "CUTETUNE_FUSE_SWIGLU": "0",
                        "CUTETUNE_TUNE_GEMV": "0", "CUTETUNE_TOPK": "3",
                        "CUTETUNE_FEEDBACK": str(tmp_path / "fb")}.items():
        monkeypatch.setenv(name, value)
    with iin.enable("predicted") as inst:  # TOPK and FEEDBACK would be errors here
        gemv = inductor_config.post_grad_custom_post_pass.user_pass
        assert isinstance(gemv, GemvPass) and gemv.user_pass is None and not gemv.tune
        assert inst.factory.source == Heuristics.load(path).digest and inst.feedback is None
    with iin.enable("predicted", fuse_swiglu=True, tune_gemv=True, model=FakeHeuristics()):
        swiglu = inductor_config.post_grad_custom_post_pass.user_pass  # grouped, SwiGLU, GEMV
        assert isinstance(swiglu, SwigluFusionPass) and swiglu.user_pass.tune
    with iin.enable("reduced", prefetch=False) as inst:
        assert inst.factory.top_k == 3 and inst.feedback is not None
    with iin.enable("reduced", top_k=2, prefetch=False) as inst:
        assert inst.factory.top_k == 2
    with iin.enable("predicted", model=FakeHeuristics(), environ={}):  # none of them
        swiglu = inductor_config.post_grad_custom_post_pass.user_pass
        assert isinstance(swiglu, SwigluFusionPass) and swiglu.user_pass.tune
    # a bad variable fails where it is read, and only there
    monkeypatch.setenv("CUTETUNE_TUNE_GEMV", "no")
    monkeypatch.setenv("CUTETUNE_TOPK", "four")
    with pytest.raises(ValueError, match="CUTETUNE_TUNE_GEMV='no'"):
        iin.enable("predicted")
    with pytest.raises(ValueError, match="CUTETUNE_TOPK='four'"):
        iin.enable("reduced", tune_gemv=True, prefetch=False)
    with iin.enable("predicted", tune_gemv=True):  # TOPK serves reduced mode only
        pass
    with iin.enable("off"):
        pass


def test_default_model_needs_packaged_heuristics(tmp_path, monkeypatch):
    monkeypatch.setattr(hz, "DATA_DIR", tmp_path)
    with pytest.raises(HeuristicsError, match="cutetune emit"):
        iin.enable("predicted")


# ---------------------------------------------------------------- GPU: torch.compile end to end
class RecordingPrefetcher:
    """Stands in for the compile workers: records what it was sent and waited for, and when."""

    def __init__(self, fail=False):
        self.sent, self.waited, self.fail = [], [], fail

    def submit(self, kernels):
        if self.fail:
            raise OSError("no worker could start")
        self.sent.append(list(kernels))
        return len(self.sent[-1])

    def wait_for(self, keys, timeout=None):
        if self.fail:
            raise OSError("the helper is gone")
        self.waited.append(list(keys))
        return True


def test_reduced_prefetches_the_graphs_kernels_once_before_benchmarking(fake_gpu):
    rec, choices_seen = RecordingPrefetcher(), []
    cache = sa.get_algorithm_selector_cache()
    with iin.enable("reduced", top_k=2, model=FakeHeuristics(), prefetch=lambda arch: rec):
        # after cutetune's hook: Inductor lowers addmm first, and by its choices the whole
        # graph's kernels must be queued
        cache.add_preprocessing_fn(lambda cs: choices_seen.append(len(rec.sent)) or cs[:1])
        try:
            lower(block, *BLOCK)
        finally:
            cache.preprocessing_fns.pop()
    assert choices_seen == [1, 1, 1] and len(rec.sent) == 1
    # the mm and the bmm, top-2 each; addmm's epilogue kernels are not the plain ones
    sent = rec.sent[0]
    assert [(p.m, p.n, p.k, p.batch, p.b_major, c) for p, c in sent] == [
        (64, 256, 512, 1, "n", A), (64, 256, 512, 1, "n", B),
        (64, 64, 64, 4, "n", A), (64, 64, 64, 4, "n", B)]
    # before each node's benchmark, a wait for that node's prefetched kernels (none for addmm):
    # the mm's TVM-FFI libraries (with a C compiler to link them), the bmm's quack kernels
    keys = [prefetch.kernel_key(p, c) for p, c in sent]
    assert rec.waited == [keys[:2], keys[2:]]
    assert [prefetch.is_library(k) for k in keys] == [aot.can_link()] * 2 + [False] * 2
    assert keys[2:] == [signature_class(p, c) for p, c in sent[2:]]
    assert iin.await_prefetched not in cache.preprocessing_fns  # removed with the installation


def dynamo_and_aot_graphs(fn, *args):
    """Dynamo's graph of ``fn`` and the forward graph AOTAutograd makes of it with Inductor's
    decompositions (what Inductor's post-grad passes start from)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    graphs = {}

    def forward(gm, example_inputs):
        graphs["aot"] = gm.graph
        return gm.forward

    backend = aot_autograd(fw_compiler=forward, decompositions=select_decomp_table())

    def capture(gm, example_inputs):
        graphs["dynamo"] = gm.graph
        return backend(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return graphs["dynamo"], graphs["aot"]


def test_dynamo_gemms_reads_the_problems_lowering_will_see():
    """The problems read from Dynamo's graph (before AOTAutograd) are those of the mm and bmm
    nodes that its decompositions make (``graph_problems``, read at lowering): linear without
    a bias on 3D activations, ``@`` folding leading dimensions, a method call on a transposed
    operand, and bmm. A linear with a bias (addmm) is neither's; a bmm of one batch is left
    out; ``@`` on activations whose leading dimensions do not fold into a view (a bmm over
    the broadcast weight here) is left to lowering."""
    from cutetune.tuner.kernels.problems import dynamo_gemms

    x, w = torch.randn(2, 32, 256, dtype=BF16), torch.randn(512, 256, dtype=BF16)
    v, bias = torch.randn(512, 128, dtype=BF16), torch.randn(512, dtype=BF16)
    y = torch.randn(4, 64, 32, dtype=BF16)

    def fn(x, w, v, bias, y):
        F = torch.nn.functional
        h = F.linear(x, w) @ v                     # mm (64x512x256), mm (64x128x512)
        g = x.transpose(0, 1) @ w.t()              # no view folds it: bmm (batch 32)
        e = F.linear(x, w, bias)                   # addmm
        return h, g, e, x[0].mm(w.t()), torch.bmm(y, y.transpose(1, 2)), torch.bmm(y[:1], y[:1].mT)

    dynamo, aot = dynamo_and_aot_graphs(fn, x, w, v, bias, y)
    got, lowered = dynamo_gemms(dynamo, lambda device: "sm90"), problems.graph_problems(aot, "sm90")
    assert got == [p for p in lowered if p.batch != 32]
    assert [(p.m, p.n, p.k, p.batch, p.a_major, p.b_major) for p in got] == [
        (64, 512, 256, 1, "k", "k"), (64, 128, 512, 1, "k", "n"), (32, 512, 256, 1, "k", "k"),
        (64, 64, 32, 4, "k", "k")]
    assert dynamo_gemms(dynamo, lambda device: None) == []  # not a quack GPU


def test_dynamo_gemms_leaves_dynamic_shapes_alone():
    """A graph traced with dynamic shapes is left to lowering: no problem to send, and no
    fake-tensor op run on its symbolic operands (one could add guards to Dynamo's shape
    environment), so no guard added."""
    from cutetune.tuner.kernels.problems import _operands, dynamo_gemms

    x, w = torch.randn(4, 16, 256, dtype=BF16), torch.randn(512, 256, dtype=BF16)
    graphs = {}

    def capture(gm, example_inputs):
        env = next(v.fake_mode.shape_env for v in (n.meta["example_value"]
                                                   for n in gm.graph.nodes
                                                   if n.op == "placeholder")
                   if isinstance(v, torch.Tensor))
        before = len(env.guards)
        graphs["got"] = dynamo_gemms(gm.graph, lambda device: "sm90")
        graphs["read"] = [n.name for n in gm.graph.nodes if _operands(n) is not None]
        graphs["new_guards"] = len(env.guards) - before
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x, w: (torch.nn.functional.linear(x, w) @ w,
                                x.transpose(0, 1) @ w.t()), backend=capture, dynamic=True)(x, w)
    assert graphs == {"got": [], "read": [], "new_guards": 0}


def test_reduced_mode_sends_kernels_from_dynamos_graph(fake_gpu):
    """Reduced mode with a prefetcher installs a pre-grad pass that runs the user's pass and
    then sends each GEMM's top-k kernels from Dynamo's graph, leaving the graph as it was; the
    user's pass comes back with the installation. Predicted mode installs none."""
    x, w = torch.randn(64, 256, dtype=BF16), torch.randn(512, 256, dtype=BF16)
    dynamo, _ = dynamo_and_aot_graphs(lambda x, w: x @ w.t(), x, w)
    before = str(dynamo)
    seen = []

    class UserPass(CustomGraphPass):
        def __call__(self, graph):
            seen.append(len(rec.sent))

        def uuid(self):
            return "user"

    rec, user = RecordingPrefetcher(), UserPass()
    inductor_config.pre_grad_custom_pass = user
    try:
        with iin.enable("predicted", model=FakeHeuristics()):
            assert inductor_config.pre_grad_custom_pass is user
        with iin.enable("reduced", top_k=2, model=FakeHeuristics(), prefetch=lambda arch: rec):
            early = inductor_config.pre_grad_custom_pass
            assert early.user_pass is user and "user" in early.uuid()
            early(dynamo)
        assert inductor_config.pre_grad_custom_pass is user
    finally:
        inductor_config.pre_grad_custom_pass = None
    assert seen == [0] and str(dynamo) == before
    assert [[(p.m, p.n, p.k, p.b_major, c) for p, c in sent] for sent in rec.sent] == [
        [(64, 512, 256, "k", A), (64, 512, 256, "k", B)]]


def test_a_chained_pass_runs_a_plain_function_first_and_then_has_no_uuid():
    """A user's pass that is a plain function (or a CustomGraphPass without a uuid) runs
    before cutetune's, and the chain then has no uuid either, so Inductor bypasses its caches
    as it would for that pass alone, instead of failing on the missing uuid."""
    from cutetune.tuner.inductor.passes import EarlyPrefetchPass

    dynamo, _ = dynamo_and_aot_graphs(lambda x, w: x @ w, torch.randn(64, 256, dtype=BF16),
                                      torch.randn(256, 512, dtype=BF16))
    ran = []

    class NoUuid(CustomGraphPass):
        def __call__(self, graph):
            ran.append("no uuid")

        def uuid(self):
            return None

    def chain(user):
        return EarlyPrefetchPass(lambda problems: ran.append(len(problems)), "k",
                                 lambda device: "sm90", user)

    plain = chain(lambda graph: ran.append("user"))
    assert plain.uuid() is None and chain(NoUuid()).uuid() is None
    assert chain(None).uuid() == "cutetune-early-prefetch:k:None"
    plain(dynamo)
    chain(NoUuid())(dynamo)
    assert ran == ["user", 1, "no uuid", 1]


def test_a_chained_pass_keys_a_graph_compiled_during_a_capture_apart(monkeypatch):
    """A graph compiled under CUDA graphs is decided by GPU time alone; a capture in progress
    is in no config Inductor keys on, and torch 2.11 asks the passes' uuids, not the
    choices': the pass's uuid (and its pickle, the pre-grad slot's key) tells it apart."""
    import pickle

    from cutetune.tuner.inductor.passes import EarlyPrefetchPass

    p = EarlyPrefetchPass(lambda problems: None, "k", lambda device: "sm90")
    outside = p.uuid()
    ich._SOURCES.setdefault("d1", FakeHeuristics(digest="d1"))
    choices = ich.ChoicesFactory("predicted", 1, "d1")()  # torch 2.13 asks it too
    choices_outside = choices.uuid()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert p.uuid() == "cutetune-early-prefetch:k:graphs:None" != outside
    assert choices.uuid() == choices_outside + ":graphs"
    assert pickle.loads(pickle.dumps(p)) == p.uuid()
    with inductor_config.patch({"triton.cudagraphs": True}):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        assert p.uuid() == "cutetune-early-prefetch:k:graphs:None"


def test_a_chained_pass_pickles_as_its_uuid_and_copies_as_itself():
    """Pickled (as torch 2.11's FX-graph cache key pickles the pre-grad slot), a pass holding
    closures is its uuid, or does not pickle without one; deep-copied (as Inductor's config
    snapshots are), it stays the pass."""
    import copy
    import pickle

    from cutetune.tuner.inductor.passes import EarlyPrefetchPass

    def chain(user):
        return EarlyPrefetchPass(lambda problems: None, "k", lambda device: "sm90", user)

    p = chain(None)
    assert pickle.loads(pickle.dumps(p)) == p.uuid() == "cutetune-early-prefetch:k:None"
    assert copy.deepcopy(p) is p and copy.copy(p) is p
    with pytest.raises(pickle.PicklingError, match="no uuid"):
        pickle.dumps(chain(lambda graph: None))


EARLY_PASS_FRESH_PROCESS = textwrap.dedent("""
    import json, torch
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    from cutetune.tuner.inductor.passes import EarlyPrefetchPass
    sent = []
    inductor_config.pre_grad_custom_pass = EarlyPrefetchPass(sent.append, "k",
                                                             lambda device: "sm90")
    w = torch.randn(256, 512, dtype=torch.bfloat16)
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    out = torch.compile(lambda x: torch.relu(x @ w))(x)
    err = ((out.float() - torch.relu(x @ w).float()).norm()
           / torch.relu(x @ w).float().norm()).item()
    print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"]
                      + counters["aot_autograd"]["autograd_cache_hit"],
                      "miss": counters["inductor"]["fxgraph_cache_miss"],
                      "bypass": counters["inductor"]["fxgraph_cache_bypass"], "err": err}))
""")


def test_a_graph_compiled_with_the_early_prefetch_pass_reloads_from_the_fx_graph_cache(
        tmp_path, run_script):
    """With the early-prefetch pass in Inductor's pre-grad slot, a graph is cached and the
    next fresh process reloads it (torch 2.11 bypassed the cache: see ChainedPass.__reduce__)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    runs = [run_script(EARLY_PASS_FRESH_PROCESS, env=env) for _ in range(2)]
    assert runs[0]["bypass"] == runs[1]["bypass"] == 0
    assert runs[0]["miss"] >= 1 and runs[1]["hit"] >= 1 and runs[1]["miss"] == 0
    assert all(r["err"] < 2e-2 for r in runs)


def test_prefetch_only_in_reduced_mode_and_its_failure_costs_nothing(fake_gpu):
    rec = RecordingPrefetcher()
    with iin.enable("predicted", model=FakeHeuristics(), prefetch=lambda arch: rec):
        lower(lambda a, b: a @ b, row(64, 256), row(256, 64))
    assert rec.sent == []
    broken = RecordingPrefetcher(fail=True)  # submit and wait_for both raise
    cache = sa.get_algorithm_selector_cache()
    with iin.enable("reduced", top_k=2, model=FakeHeuristics(), prefetch=lambda arch: broken):
        cache.add_preprocessing_fn(lambda cs: cs[:1])  # after cutetune's wait
        try:
            assert lower(lambda a, b: a @ b, row(64, 256), row(256, 64)) == [
                ("extern_kernels.mm", {})]
        finally:
            cache.preprocessing_fns.pop()
    assert ich._prefetch_for is None  # restored with the installation


def test_graph_problems_reads_mm_and_bmm_nodes():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(64, 256, dtype=BF16), torch.randn(512, 256, dtype=BF16)
    y, z = torch.randn(4, 64, 32, dtype=BF16), torch.randn(64, 100, dtype=torch.float32)
    # a bmm of one batch is left out: its kernel is batched, its problem would read as a mm's
    gm = make_fx(lambda x, w, y, z: ((x @ w.t()) @ w, torch.bmm(y, y.transpose(1, 2)),
                                     z @ z.t(), x @ w.t(), torch.bmm(y[:1], y[:1].mT)))(x, w, y, z)
    got = problems.graph_problems(gm.graph, "sm90")
    assert [(p.m, p.n, p.k, p.batch, p.a_major, p.b_major) for p in got] == [
        (64, 512, 256, 1, "k", "k"), (64, 256, 512, 1, "k", "n"), (64, 64, 32, 4, "k", "k")]
    assert problems.graph_problems(gm.graph, None) == []  # not a quack GPU: nothing to build


def test_prefetcher_reports_kernels_lost_with_its_helper(tmp_path):
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    pf = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    assert pf.submit([(GemmProblem(256, 512, 1024, b_major="k"), A)]) == 1
    pf.close()  # killed while importing quack: the kernel will never come
    assert pf.wait(timeout=30) == {"submitted": 1, "done": 0, "cached": 0, "failed": 1}


def test_forked_helper_keeps_none_of_this_processs_descriptors(tmp_path):
    """The helper is forked from this process and closes every descriptor it inherited but its
    own pipes: a pipe this process closes still reaches end of file at its reader (a helper
    holding a copy would keep, e.g., Inductor's compile workers waiting for theirs)."""
    import select

    from cutetune.tuner.kernels.helper import KernelPrefetcher

    r, w = os.pipe()
    pf = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    try:
        pf.start()
        assert pf._proc is not None  # forked
        os.close(w)
        assert select.select([r], [], [], 30)[0] and os.read(r, 1) == b""
    finally:
        os.close(r)
        pf.close()


EARLY_FORK = """
import json, sys, torch
import cutetune
from cutetune.tuner.kernels import launcher, helper as prefetch, problems

torch.cuda.is_available = lambda: True  # a stand-in sm90 GPU: only the helper needs it
problems.device_arch = lambda device: "sm90"
forked_with = []


class Helper(prefetch._ForkedHelper):
    def __init__(self, *args):
        forked_with.append(sorted(m for m in sys.modules if m.startswith("torch._inductor")))
        super().__init__(*args)


prefetch._ForkedHelper = Helper
with cutetune.enable(sys.argv[1]) as installed:
    helper = prefetch.SHARED_PREFETCHERS.get("sm90")
    imported = helper is not None and prefetch._poll(lambda: helper.timeline, 120)
    print(json.dumps({"forked_with": forked_with, "imported": bool(imported),
                      "installed": installed.factory is not None}))
"""


def test_cutetune_enable_forks_the_reduced_helper_before_inductor_is_imported(run_script):
    """``cutetune.enable("reduced")`` forks the compile helper before anything of Inductor is
    imported, so the helper's imports run beside Inductor's; then installs as
    ``cutetune.tuner.inductor.enable`` does, with no second helper. Predicted mode forks
    none."""
    for mode, forks in (("reduced", 1), ("predicted", 0)):
        got = run_script(EARLY_FORK, mode, timeout=300)
        assert got["installed"] and len(got["forked_with"]) == forks
        assert got["forked_with"] == [[]] * forks and got["imported"] == bool(forks)


def test_the_helpers_imports_leave_torch_compile_uncompiled_and_restore_it():
    """What quack wraps in ``torch.compile`` at its import, in the helper: the function
    itself, as a call or as a decorator, and ``torch.compile`` again after the imports."""
    from cutetune.tuner.kernels import helper as prefetch

    compile_ = torch.compile

    def fn(x):
        return x + 1

    with prefetch._uncompiled_torch_compile():
        assert torch.compile(fn, dynamic=False) is fn
        assert torch.compile(dynamic=False)(fn) is fn
    assert torch.compile is compile_
    with pytest.raises(RuntimeError), prefetch._uncompiled_torch_compile():
        raise RuntimeError("an import failed")
    assert torch.compile is compile_


def test_a_helper_that_does_not_start_is_stopped_and_its_kernels_fail(tmp_path, monkeypatch,
                                                                      caplog):
    """A forked helper stuck before its imports end (a lock another thread held at the fork)
    is stopped after START_TIMEOUT_S: its kernels fail at once, naming why, so nothing waits
    for them any longer."""
    from cutetune.tuner.kernels import helper as prefetch

    monkeypatch.setattr(prefetch, "START_TIMEOUT_S", 0.5)
    monkeypatch.setattr(prefetch, "serve", lambda arch, workers, jobs, reports: time.sleep(600))
    pf = prefetch.KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    try:
        assert pf.submit([(GemmProblem(256, 512, 1024, b_major="k"), A)]) == 1
        t0 = time.monotonic()
        assert pf.wait(timeout=30) == {"submitted": 1, "done": 0, "cached": 0, "failed": 1}
        assert time.monotonic() - t0 < 10
    finally:
        pf.close()
    assert list(pf.state.values()) == ["failed: the compile helper did not start in 0.5 s"]
    assert "did not start" in caplog.text


def test_helper_reports_reach_it_alone_and_a_crashed_helper_is_not_signalled(
        tmp_path, monkeypatch, caplog):
    """The helper's reports have a pipe of their own: what else it prints (a library's
    output) never reaches them, and a line that is not a report is skipped. A helper that
    ended is reaped, its pending kernels fail at once, and the start timeout then leaves it
    (and whatever process took its pid) alone."""
    from cutetune.tuner.kernels import helper as prefetch

    def serve(arch, workers, jobs, reports):
        got = b""
        while got.count(b"\n") < 2:  # both jobs arrived
            got += os.read(jobs, 1 << 16)
        print("done 0 (a library's stray output)", flush=True)
        for line in ("imported test", "a line that is not a report", "started 0", "done 0",
                     "failed 7 no such job"):
            reports.write(f"{line}\n")
        reports.flush()
        raise RuntimeError("the helper crashed")

    monkeypatch.setattr(prefetch, "START_TIMEOUT_S", 0.3)
    monkeypatch.setattr(prefetch, "serve", serve)
    killed = []
    monkeypatch.setattr(prefetch.os, "kill", lambda pid, sig: killed.append(pid))
    problem = GemmProblem(256, 512, 1024, b_major="k")
    pf = prefetch.KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    assert pf.submit([(problem, A), (problem, C)]) == 2
    assert pf.wait(timeout=30) == {"submitted": 2, "done": 1, "cached": 0, "failed": 1}
    assert [e for _, e in pf.timeline] == ["imported test", "started 0", "done 0",
                                            "failed 7 no such job"]
    assert pf.state[prefetch.kernel_key(problem, C)] == "failed: the compile helper exited"
    time.sleep(0.6)  # past the start timeout
    pf.close()
    assert pf._proc is None and killed == [] and "did not start" not in caplog.text


def test_a_helper_that_cannot_be_forked_turns_the_prefetcher_off(tmp_path, monkeypatch, caplog):
    """Fork failing (no memory for the copy) costs no descriptor and no compile: the
    prefetcher is off, nothing is queued, and kernels are built where they are needed."""
    from cutetune.tuner.kernels import helper as prefetch

    def fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(prefetch.os, "fork", fork)
    before = len(os.listdir("/proc/self/fd"))
    pf = prefetch.KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    assert pf.submit([(GemmProblem(256, 512, 1024, b_major="k"), A)]) == 0
    assert pf.submit([(GemmProblem(256, 512, 2048, b_major="k"), A)]) == 0
    assert not pf.enabled and pf.stats()["submitted"] == 0
    assert len(os.listdir("/proc/self/fd")) == before
    assert "could not start" in caplog.text


def test_prefetcher_does_not_wait_for_kernels_already_on_disk(tmp_path, monkeypatch):
    """A kernel in quack's cache counts as cached at once, before the helper has started
    (kernels a library cannot hold, or all without a C compiler); a library built already is
    not even queued."""
    from cutetune.tuner.kernels.compile import kernel_object_path
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    problem, other = GemmProblem(256, 512, 1024), GemmProblem(256, 512, 1024, b_major="n")
    monkeypatch.setattr(aot, "can_link", lambda: True)
    meta = aot.library_paths(prefetch.kernel_key(problem, A)[1])[1]
    meta.parent.mkdir(parents=True)
    meta.write_text("{}")
    pf = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    try:
        assert pf.submit([(problem, A)]) == 0 and pf.stats()["submitted"] == 0
        assert pf.wait_for([prefetch.kernel_key(problem, A)], timeout=0)
    finally:
        pf.close()
    monkeypatch.setattr(aot, "can_link", lambda: False)
    path = kernel_object_path(problem, A, str(tmp_path))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an object file")
    pf = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path))
    try:
        assert pf.submit([(problem, A), (other, A)]) == 2
        t0 = time.monotonic()
        assert pf.wait_for([signature_class(problem, A)], timeout=60)
        assert time.monotonic() - t0 < 5  # the helper takes longer than this to import quack
        assert not pf.wait_for([signature_class(other, A)], timeout=0)  # still compiling
    finally:
        pf.close()


@pytest.mark.compile
def test_prefetcher_compiles_into_quacks_cache_without_a_gpu(tmp_path, monkeypatch):
    """The real workers: forked from the helper that imported quack, GPU-blind, each kernel
    once; starting does not wait for the helper's imports; a kernel on disk is not rebuilt,
    and its file is where quack's jit cache looks (``kernel_object_path``). (Without a C
    compiler: with one, these kernels are built as libraries, the next test.)"""
    from cutetune.tuner.kernels.compile import kernel_object_path
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    monkeypatch.setattr(aot, "can_link", lambda: False)

    p = GemmProblem(256, 512, 1024, b_major="k")
    default = quack_default_config("sm90")
    kernels = [(p, default), (GemmProblem(64, 512, 1024, b_major="k"), default), (p, C)]
    for expect in ({"submitted": 2, "done": 2, "cached": 0, "failed": 0},
                   {"submitted": 2, "done": 0, "cached": 2, "failed": 0}):
        pf = KernelPrefetcher("sm90", workers=2, cache_dir=str(tmp_path))
        try:
            t0 = time.perf_counter()
            pf.start()
            assert time.perf_counter() - t0 < 1.0
            assert pf.submit(kernels) == 2  # one kernel serves every M
            assert pf.wait(timeout=300) == expect
        finally:
            pf.close()
    objects = sorted(tmp_path.rglob("*.o"))
    assert len(objects) == 2
    assert sorted(kernel_object_path(q, c, str(tmp_path)) for q, c in kernels[1:]) == objects


LOAD_PLAIN_WITHOUT_CUTLASS = """
import json, sys, torch, tvm_ffi
from cutetune.tuner.kernels import aot
out = []
for key in sys.argv[1:]:
    meta = json.loads(aot.library_paths(key)[1].read_text())
    fn = tvm_ffi.load_module(str(aot.library_paths(key)[0]))[meta["function"]]
    a = torch.empty(256, 128, dtype=torch.bfloat16)
    try:
        fn(a, a.t(), a, None, *meta["tail"])
        out.append(None)
    except ValueError as e:
        out.append(str(e))
print(json.dumps({"errors": out, "imported": [m for m in ("cutlass", "quack") if m in sys.modules]}))
"""


@pytest.mark.compile
def test_prefetcher_builds_plain_kernel_libraries_without_a_gpu(tmp_path, monkeypatch,
                                                                run_script):
    """With a C compiler, the helper builds each plain mm kernel as a TVM-FFI library (one
    serves every M; a swap_ab config too), which a fresh process loads with tvm_ffi alone
    (no cutlass, no quack) up to the kernel's own argument checks (a CPU tensor is refused);
    a library built already is not queued again. A batched kernel goes to quack's disk cache
    only."""
    from cutetune.tuner.kernels.compile import kernel_object_path
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    if not aot.can_link():
        pytest.skip("no C compiler to link libraries")
    p, t = GemmProblem(256, 512, 1024, b_major="k"), GemmProblem(256, 512, 1024, a_major="m")
    default = quack_default_config("sm90")
    kernels = [(p, default), (GemmProblem(64, 512, 1024, b_major="k"), default), (t, B),
               (GemmProblem(64, 64, 64, batch=4), C)]
    pf = KernelPrefetcher("sm90", workers=2, cache_dir=str(tmp_path / "quack"))
    try:  # another swizzle is a launch argument of the same library
        assert pf.submit(kernels + [(p, replace(default, max_swizzle_size=1))]) == 3
        assert pf.wait(timeout=300) == {"submitted": 3, "done": 3, "cached": 0, "failed": 0}
    finally:
        pf.close()
    keys = [prefetch.kernel_key(q, c) for q, c in kernels]
    assert [prefetch.is_library(k) for k in keys] == [True, True, True, False]
    assert all(aot.library_ready(k[1]) for k in keys[:3])
    # every kernel's object is also where quack's own path looks, should a library not load
    assert sorted((tmp_path / "quack").rglob("*.o")) == sorted(
        {kernel_object_path(q, c, str(tmp_path / "quack")) for q, c in kernels})
    again = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path / "quack"))
    try:
        assert again.submit(kernels[:3]) == 0
    finally:
        again.close()
    monkeypatch.setattr(aot, "max_active_clusters", lambda device, size: 7)  # no GPU to ask
    lib = aot.Library(keys[0][1], torch.device("cpu"), default.cluster_size, swizzle=1)
    assert lib.tail[1][:3] == (7, None, 1)  # clusters, raster order, the swizzle asked for
    got = run_script(LOAD_PLAIN_WITHOUT_CUTLASS, keys[0][1], keys[2][1])
    assert got["imported"] == [], got
    assert all("expected device_type=cuda" in e for e in got["errors"]), got


PLAIN_SWIGLU = KernelConfig(tile_m=128, tile_n=128, pingpong=False)


@pytest.mark.compile
def test_prefetcher_builds_fused_kernel_libraries_without_a_gpu(tmp_path, monkeypatch):
    """The helper builds a fused SwiGLU kernel's TVM-FFI library (``swiglu.build_library``)
    once; a library already built is not queued again."""
    from cutetune.tuner.kernels import aot, swiglu
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cutetune"))
    up = GemmProblem(2048, 14336, 4096, b_major="k")
    config = KernelConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2)
    pf = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path / "quack"))
    try:
        key = pf.submit_swiglu(up, config)
        assert pf.submit_swiglu(up, config) == key and pf.stats()["submitted"] == 1
        assert pf.build_state(key) in ("pending", "done")
        assert pf.wait(timeout=300)["done"] == 1 and pf.build_state(key) == "done"
        events = [e for _, e in pf.timeline]
        assert [e.split()[0] for e in events] == ["imported", "started", "done"], events
        assert events[1:] == ["started 0", "done 0"]
        assert [w.split("=")[0] for w in events[0].split()[1:]] == ["gpu_blind", "quack"]
        assert sorted(pf.timeline) == pf.timeline
        assert pf.wait_for([key], timeout=0) and aot.library_ready(key)
        assert key == swiglu.library_key(config, "sm90", BF16, ("k", "k"))
    finally:
        pf.close()
    again = KernelPrefetcher("sm90", workers=1, cache_dir=str(tmp_path / "quack"))
    assert again.submit_swiglu(up, config) == key and again.stats()["submitted"] == 0


def test_fused_kernels_are_built_by_the_helper_when_they_can_be(monkeypatch, tmp_path):
    """What a fusion starts: nothing when the kernel's library is built; else a build by the
    compile helper, whose state the first launches read without waiting; nothing without a C
    compiler."""
    from cutetune.tuner.kernels import aot, swiglu

    class Helper:
        enabled = True

        def __init__(self):
            self.sent, self.states = [], {"k1": "pending"}

        def submit_swiglu(self, problem, config):
            self.sent.append((problem, config))
            return "k1"

        def build_state(self, key):
            return self.states[key]

    helper = Helper()
    monkeypatch.setattr(iin, "shared_prefetcher", lambda arch: helper)
    monkeypatch.setattr(swiglu, "_builds", {})
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path))
    up = GemmProblem(2048, 14336, 4096, b_major="k")
    iin.prepare_fused_kernel(up, PLAIN_SWIGLU)
    assert helper.sent == [(up, PLAIN_SWIGLU)]
    assert swiglu._builds["k1"]() == "pending"
    helper.states["k1"] = "done"
    assert swiglu._builds["k1"]() == "done"
    swiglu._builds.clear()
    monkeypatch.setattr(aot, "can_link", lambda: False)
    iin.prepare_fused_kernel(up, PLAIN_SWIGLU)
    assert len(helper.sent) == 1 and not swiglu._builds
    monkeypatch.setattr(aot, "can_link", lambda: True)
    _, meta = aot.library_paths(swiglu.library_key(PLAIN_SWIGLU, "sm90", BF16, ("k", "k")))
    meta.parent.mkdir(parents=True)
    meta.write_text("{}")
    iin.prepare_fused_kernel(up, PLAIN_SWIGLU)
    assert len(helper.sent) == 1 and not swiglu._builds


gpu = pytest.mark.gpu


class FixedModel:
    """Plumbing only: the same three configs for every problem, never cuBLAS."""

    def rank(self, problem, configs=None, top_k=None):
        return [(c, float(i)) for i, c in enumerate((quack_default_config("sm90"), B, C))][:top_k]

    def prefers_cublas(self, problem, configs=None):
        return False


class LlamaMLP(torch.nn.Module):
    def __init__(self, hidden=1024, inter=2816):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, inter, bias=False)
        self.up = torch.nn.Linear(hidden, inter, bias=False)
        self.down = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@gpu
def test_gpu_helper_forked_from_a_cuda_process_builds_kernels_that_run_here(tmp_path,
                                                                            monkeypatch):
    """The compile helper is forked from a process whose CUDA context is live, which a fork
    cannot share: it builds GPU-blind, and this process loads its kernels (milliseconds, where
    compiling them here would take over a second) and runs them correctly: one from its TVM-FFI
    library (with a C compiler), one from quack's disk cache (as without a C compiler)."""
    import quack.cache as qcache

    from cutetune.tuner.kernels.compile import kernel_object_path
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    monkeypatch.setattr(qcache, "CACHE_DIR", str(tmp_path))  # a cold kernel cache
    monkeypatch.setattr(launcher, "_plans", {})
    quack_gemm.import_quack()
    torch.zeros(1, device="cuda")
    problem = GemmProblem(512, 1024, 2048, b_major="k")
    other = GemmProblem(512, 1024, 2048, b_major="n")  # another kernel: B "n"-major
    pf = KernelPrefetcher(problems.device_arch(torch.device("cuda")), workers=2,
                          cache_dir=str(tmp_path))
    try:
        assert pf.submit([(problem, C)]) == 1
        with monkeypatch.context() as no_cc:
            no_cc.setattr(aot, "can_link", lambda: False)
            assert pf.submit([(other, C)]) == 1
        assert pf.wait(timeout=300) == {"submitted": 2, "done": 2, "cached": 0, "failed": 0}
    finally:
        pf.close()
    library = aot.can_link()
    key = prefetch.kernel_key(problem, C)
    assert prefetch.is_library(key) == library
    assert not library or aot.library_ready(key[1])
    # a library's build also leaves its object in quack's disk cache, for quack's own path
    assert kernel_object_path(problem, C, str(tmp_path)).exists()
    assert kernel_object_path(other, C, str(tmp_path)).exists()
    a = torch.randn(512, 2048, device="cuda", dtype=BF16)
    wt = torch.randn(1024, 2048, device="cuda", dtype=BF16).t()
    t0 = time.perf_counter()
    outs = [launcher.quack_mm_out(a, b, torch.empty(512, 1024, device="cuda", dtype=BF16), C)
            for b in (wt, wt.contiguous())]
    torch.cuda.synchronize()
    assert time.perf_counter() - t0 < 1.0
    for out in outs:
        assert _rel_err(out, a.float() @ wt.float()) < 1e-2
    assert [p.via for p in launcher._plans.values()] == ["library" if library else "quack",
                                                         "quack"]


@gpu
@pytest.mark.parametrize("mode,dtype", [("off", BF16), ("predicted", BF16), ("reduced", BF16),
                                        ("predicted", FP16), ("reduced", FP16)])
def test_gpu_compiled_llama_mlp(tmp_path, mode, dtype, monkeypatch, caplog):
    """The MLP compiled in each mode runs right, in bf16 and fp16 (with heuristics for the
    dtype); predicted mode puts every GEMM on quack, and reduced mode sends the graph's
    kernels to the compile helper from Dynamo's graph, so that lowering finds none left to
    send."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    caplog.set_level(logging.INFO, logger="cutetune.tuner.inductor")
    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 0.0)  # small shapes: plumbing, not the rule
    torch.manual_seed(0)
    mlp = LlamaMLP().cuda().to(dtype)
    x = torch.randn(256, 1024, device="cuda", dtype=dtype)
    path = hz.build(FixedModel(), "sm90", "bf16" if dtype == BF16 else "fp16",
                    grid=Grid()).save(tmp_path / "h.json")
    torch._dynamo.reset()
    with torch.no_grad(), fresh_cache(), iin.enable(mode, model=None if mode == "off" else path):
        out, code = run_and_get_code(torch.compile(mlp), x)
        ref = mlp(x)
    assert _rel_err(out, ref) < 2e-2
    code = "".join(code)
    n_quack = code.count(f"extern_kernels.{launcher.MM_KERNEL}(")
    if mode == "predicted":
        assert n_quack >= 1 and "extern_kernels.mm(" not in code  # every GEMM on quack
    elif mode == "off":
        assert n_quack == 0  # reduced: whatever Inductor's benchmark picked
    sent = [m for m in (r.getMessage() for r in caplog.records) if "compile workers" in m]
    if mode == "reduced":
        assert len(sent) == 2 and sent[0].endswith("from Dynamo's graph"), sent
        assert not sent[0].startswith("cutetune: 0 ") and sent[1].startswith("cutetune: 0 ")
    else:
        assert sent == []


@gpu
def test_gpu_one_row_mlp_under_cuda_graphs_runs_gemv_reductions():
    """mode="reduce-overhead" at M=1 in predicted mode: the MLP's GEMMs become Triton
    reductions (no extern GEMM), tuned by coordinate descent, and the replays run right."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    torch.manual_seed(0)
    mlp = LlamaMLP().cuda().to(BF16)
    x = torch.randn(1, 1024, device="cuda", dtype=BF16)
    torch._dynamo.reset()
    with torch.no_grad(), fresh_cache(), iin.enable("predicted"):
        fn = torch.compile(mlp, mode="reduce-overhead")
        out, code = run_and_get_code(fn, x)
        for _ in range(3):
            out = fn(x).clone()
        ref = mlp(x)
    code = "".join(code)
    assert not re.search(r"extern_kernels\.\w+\(", code) and re.search(r"triton_(red|per)_", code)
    assert "'coordinate_descent_tuning': True" in code and "'max_autotune_pointwise': True" in code
    assert not inductor_config.coordinate_descent_tuning
    assert _rel_err(out, ref) < 2e-2


@gpu
def test_gpu_compiled_llama_mlp_with_a_dynamic_m(monkeypatch):
    """The MLP compiled once with its M dynamic (as Dynamo recompiles a graph for a new batch
    size) runs every M right in that one graph, each projection on quack (the plain ones by
    range of M, the up projection fused by range of M: its kernel from the compile helper)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache, run_and_get_code

    from cutetune.tuner.kernels import swiglu

    monkeypatch.setattr(idec, "QUACK_LAUNCH_HOST_US", 0.0)  # small shapes: plumbing, not the rule
    monkeypatch.setenv("CUTETUNE_FUSED_KERNELS", "")
    monkeypatch.setattr(prefetch, "SHARED_PREFETCHERS", {})
    monkeypatch.setattr(launcher, "_plans", {})
    monkeypatch.setattr(swiglu, "_plans", {})
    monkeypatch.setattr(swiglu, "_builds", {})
    torch.manual_seed(0)
    mlp = LlamaMLP().cuda().to(BF16)
    x = torch.randn(256, 1024, device="cuda", dtype=BF16)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad(), fresh_cache(), iin.enable("predicted", model=FixedModel()):
            compiled = torch.compile(mlp)
            code = "".join(run_and_get_code(compiled, x)[1])
            if aot.can_link():
                iin.shared_prefetcher("sm90").wait(timeout=300)
                assert iin.shared_prefetcher("sm90").failures() == {}
            for m in (64, 200, 256, 1000):
                xm = torch.randn(m, 1024, device="cuda", dtype=BF16)
                assert _rel_err(compiled(xm), mlp(xm)) < 2e-2
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        for helper in prefetch.SHARED_PREFETCHERS.values():
            helper.close()
    assert code.count(f"extern_kernels.{launcher.MM_BY_M_KERNEL}(") == 2  # gate and down
    assert code.count(f"extern_kernels.{swiglu.MM_SILU_MUL_BY_M_KERNEL}(") == 1
    ran = lambda plans: {k[1][0]: p.via for k, p in plans.items()}  # noqa: E731
    assert set(ran(launcher._plans)) == {256, 64, 200, 1000}
    assert None not in ran(launcher._plans).values()
    assert set(ran(swiglu._plans)) == {256, 64, 200, 1000}
    assert set(ran(swiglu._plans).values()) == {"library" if aot.can_link() else "quack"}


def _compile_host_bound_mm(mode: str, fn, m: int, n: int, k: int, transposed_b: bool,
                           feedback=None):
    """Compile and run ``fn(x, w)`` in ``mode`` (reduced: with ``feedback``) from a fresh
    Inductor cache, with w (n, k) when ``transposed_b`` (nn.Linear's weight) else (k, n).
    Returns the output, the reference, the generated code and the choice types Inductor
    benchmarked (a feedback saver's view)."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    timed = []
    cache = sa.get_algorithm_selector_cache()

    def saver(timings, *rest, **kw):
        timed.extend(type(c).__name__ for c in timings)

    cache.add_feedback_saver(saver)
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=BF16)
    w = torch.randn(*((n, k) if transposed_b else (k, n)), device="cuda", dtype=BF16)
    torch._dynamo.reset()
    try:
        with torch.no_grad(), fresh_cache(), iin.enable(mode, prefetch=False, feedback=feedback):
            out, code = run_and_get_code(torch.compile(fn), x, w)
    finally:
        cache.feedback_saver_fns.remove(saver)
    return out, fn(x, w), "\n".join(code), timed


@gpu
def test_gpu_reduced_benchmarks_triton_templates_for_host_bound_mm(tmp_path):
    """A 16x1024x1024 mm is host-bound, the packaged launch costs favour Triton for a graph
    of it, and their retime never measured it: reduced mode benchmarks Inductor's Triton
    templates without ATen (choice types seen by a feedback saver; ATen only behind them, as
    the untimed last resort), runs the winner correctly, and its feedback appends the
    benchmark as a Triton sweep row that ``cutetune emit --triton-sweep`` reads."""
    from cutetune.models.triton_mm import load_sweep
    from cutetune.models.heuristics import PackagedHeuristics

    h, p = PackagedHeuristics(), P(16, 1024, 1024)
    assert h.triton_problems([(p, h.triton_config(p))]) == {p}
    assert h.triton_config(p, measured_only=True) is None
    out, ref, code, timed = _compile_host_bound_mm("reduced", lambda a, b: a @ b.t(), 16,
                                                   1024, 1024, transposed_b=True,
                                                   feedback=tmp_path)
    assert "TritonTemplateCaller" in timed and "ExternKernelCaller" not in timed
    assert "LastResortCaller" in timed and "extern_kernels.mm(" not in code
    assert _rel_err(out, ref) < 2e-2
    (row,) = load_sweep(tmp_path / ifb.TRITON_FEEDBACK)
    assert (row.m, row.n, row.k, row.majors) == (16, 1024, 1024, "kk")
    assert row.aten_ms is None and len(row.triton_ms) > 1


@gpu
def test_gpu_reduced_runs_aten_for_host_bound_mm_where_every_triton_template_fails(monkeypatch):
    """The mm of the test above with every Triton template made to fail in Inductor's
    benchmark (a RuntimeError, as a bad launch raises): the compile does not fail
    (``NoValidChoicesError``); the node runs ATen, the last resort, correctly."""
    import re

    def fail(self, *args, **kwargs):
        raise RuntimeError("cutetune test: every Triton template fails")

    monkeypatch.setattr(sa.TritonTemplateCaller, "benchmark", fail)
    out, ref, code, timed = _compile_host_bound_mm("reduced", lambda a, b: a @ b.t(), 16,
                                                   1024, 1024, transposed_b=True)
    assert "TritonTemplateCaller" in timed and "LastResortCaller" in timed
    assert "extern_kernels.mm(" in code and not re.search(r"\btriton_tem_\w+\.run\(", code)
    assert _rel_err(out, ref) < 2e-2


@gpu
def test_gpu_predicted_runs_the_packaged_triton_config_for_host_bound_mm():
    """x @ W.t() at 16x4096x4096 is host-bound and memory-bound on an H200: predicted mode
    compiles the packaged heuristics' Triton config for it, alone (a Triton template in the
    generated code with that config's tiles, no ATen call, nothing benchmarked), and runs it
    correctly."""
    import re

    from cutetune.models.heuristics import PackagedHeuristics

    want = PackagedHeuristics().triton_config(P(16, 4096, 4096))
    assert want, "the packaged heuristics name a Triton config for this shape"
    out, ref, code, timed = _compile_host_bound_mm("predicted", lambda a, b: a @ b.t(), 16,
                                                   4096, 4096, transposed_b=True)
    assert timed == []
    assert re.search(r"\btriton_tem_\w+\.run\(", code) and "extern_kernels.mm(" not in code
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        assert re.search(rf"\b{k}\s*:\s*tl\.constexpr\s*=\s*{want[k]}\b", code), k
    assert _rel_err(out, ref) < 2e-2


@gpu
def test_gpu_predicted_mode_answers_from_this_gpus_own_heuristics():
    """Predicted mode's default source asks the running GPU's name at its first lookup: on a
    GPU measured apart (an H100: cutetune/data/h100_sxm/) that GPU's file and model answer,
    on any other the arch's."""
    from cutetune.models.heuristics import DATA_DIR, PackagedHeuristics, device_folder

    own = device_folder(DATA_DIR, torch.cuda.get_device_name())
    installation = iin.enable("predicted")
    try:
        source = ich._SOURCES[installation.factory.source]
    finally:
        installation.disable()
    for p in (P(4096, 14336, 4096), P(4096, 4096, 14336, a_major="m", b_major="n"),
              P(333, 5000, 2000)):
        want = (PackagedHeuristics(own) if own else PackagedHeuristics()).lookup(p)
        assert source.lookup(p) == want
    assert (source._own is not None) == (own is not None)


TEMPLATE_CACHE_PROCESS = textwrap.dedent("""
    import json, re, torch
    from torch._inductor.utils import run_and_get_code
    from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
    from cutetune.tuner.kernels import problems
    from cutetune.models import triton_mm as tmm
    from cutetune.tuner.inductor.template_cache import TemplateKernelCache, stored_templates
    torch.manual_seed(0)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), iin.enable("predicted"):
        out, code = run_and_get_code(torch.compile(lambda a, b: a @ b.t()), x, w)
    ref = x @ w.t()
    print(json.dumps({"loads": TemplateKernelCache.loads, "stores": TemplateKernelCache.stores,
                      "stored": stored_templates(),
                      "template_ran": bool(re.search(r"\\btriton_tem_\\w+\\.run\\(", "".join(code))),
                      "err": ((out.float() - ref.float()).norm() / ref.float().norm()).item()}))
""")


@gpu
def test_gpu_template_kernel_cache_serves_a_fresh_inductor_cache(tmp_path, run_script):
    """Predicted mode's Triton template for a host-bound mm (the test above's), compiled in a
    fresh process by Inductor's compile workers, lands in cutetune's template cache; a second
    fresh process with a fresh Inductor cache (compiling in-process, so that the cache's counts
    are its own) loads it from there instead of compiling it, and runs it correctly."""
    runs = []
    for i, threads in enumerate(("", "1")):  # "": Inductor's default, its compile workers
        env = {"CUTETUNE_TEMPLATE_CACHE_DIR": str(tmp_path / "templates"),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor{i}")}
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
        runs.append(run_script(TEMPLATE_CACHE_PROCESS, env=env,
                               drop=("TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER")))
    workers, in_process = runs
    assert workers["template_ran"] and workers["stored"] >= 1
    assert in_process["template_ran"] and in_process["loads"] >= 1
    assert in_process["stores"] == 0 and in_process["stored"] == workers["stored"]
    assert all(r["err"] < 2e-2 for r in runs)


FRESH_PROCESS = textwrap.dedent("""
    import json, sys, torch
    from torch._dynamo.utils import counters
    from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
    from cutetune.tuner.kernels import problems
    from cutetune.models import triton_mm as tmm
    idec.QUACK_LAUNCH_HOST_US = 0.0  # a small shape: the plumbing, not the host-bound rule
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 2048, bias=True).cuda().to(torch.bfloat16)
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    with iin.enable("predicted", model=sys.argv[1]):
        out = torch.compile(lin)(x)
    err = ((out.float() - lin(x).float()).norm() / lin(x).float().norm()).item()
    print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"]
                      + counters["aot_autograd"]["autograd_cache_hit"],
                      "miss": counters["inductor"]["fxgraph_cache_miss"], "err": err}))
""")


@gpu
def test_gpu_fx_graph_cache_reload_in_fresh_process(tmp_path, run_script):
    path = hz.build(FixedModel(), "sm90", "bf16", grid=Grid()).save(tmp_path / "h.json")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    runs = [run_script(FRESH_PROCESS, path, env=env) for _ in range(2)]
    assert runs[0]["miss"] >= 1 and runs[1]["hit"] >= 1 and runs[1]["miss"] == 0
    assert all(r["err"] < 2e-2 for r in runs)
    cached = "".join(p.read_text() for p in (tmp_path / "inductor").rglob("*.py"))
    assert launcher.ADDMM_KERNEL in cached or launcher.MM_KERNEL in cached


def _compiled_code(fn, args, graphs: bool, arch="sm90") -> tuple[torch.Tensor, str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    gemv = GemvPass("k", lambda device: arch)
    with inductor_config.patch({"fx_graph_cache": False, "triton.cudagraphs": graphs,
                                "post_grad_custom_post_pass": gemv}):
        out, code = run_and_get_code(torch.compile(fn), *args)
    return out, "".join(code)


def _gemm_forms(m: int, dtype):
    """A linear under a relu (mm), with a residual add (addmm after Inductor's post-grad
    passes), a batched product (bmm), and an addmm with its own beta and alpha, each with
    ``m`` rows."""
    g = torch.Generator().manual_seed(0)
    w, r = torch.randn(48, 64, generator=g).to(dtype), torch.randn(m, 48, generator=g).to(dtype)
    x, q, k = (torch.randn(*s, generator=g).to(dtype) for s in ((m, 64), (3, m, 64), (3, 64, 8)))

    def fn(x, q, k):
        return (torch.relu(x @ w.t()), x @ w.t() + r, torch.bmm(q, k),
                torch.addmm(r, x, w.t(), beta=0.5, alpha=2.0))

    return fn, (x, q, k)


@pytest.mark.parametrize("dtype", [BF16, FP16, torch.float32])
def test_gemv_pass_turns_one_row_gemms_into_reductions_under_cuda_graphs(dtype, caplog):
    """Under CUDA graphs one-row mm, addmm and bmm leave the extern GEMMs for fused
    reductions, computed in fp32, but an addmm that scales its terms; two rows, no graphs, or
    a device quack does not serve keep them (on the CPU Inductor itself lowers a one-row bmm
    without an extern kernel). Every result stays right."""
    caplog.set_level(logging.INFO, logger="cutetune.tuner.inductor")
    fn, args = _gemm_forms(1, dtype)
    outs, code = _compiled_code(fn, args, graphs=True)
    assert re.findall(r"extern_kernels\.(\w+)\(", code) == ["addmm"]  # its own beta, alpha
    assert sum("as a GEMV reduction" in r.getMessage() for r in caplog.records) == 3
    for out, ref in zip(outs, fn(*args)):
        assert _rel_err(out, ref) < 1e-2
    for m, graphs, arch in ((2, True, "sm90"), (1, False, "sm90"), (1, True, None)):
        fn, args = _gemm_forms(m, dtype)
        code = _compiled_code(fn, args, graphs, arch)[1]
        assert {"mm", "addmm"} <= set(re.findall(r"extern_kernels\.(\w+)\(", code))
    assert sum("as a GEMV reduction" in r.getMessage() for r in caplog.records) == 3


def test_gemv_pass_tunes_the_graphs_it_rewrote_until_the_compile_ends():
    """max-autotune's reduction tuning is on while a graph with a GEMV is generated, off for a
    graph without one (each side of a graph break is a compile of its own), and back off
    when the compile ends; a flag the user set stays set."""
    from torch._inductor.utils import run_and_get_code

    from cutetune.tuner.inductor.passes import REDUCTION_TUNING

    seen = []
    gemv = GemvPass("k", lambda device: "sm90")

    def recording(graph):  # the flags as the graph's kernels will be generated
        gemv(graph)
        seen.append(tuple(getattr(inductor_config, name) for name in REDUCTION_TUNING))

    w = torch.randn(48, 64, dtype=BF16)

    def fn(x, y):
        a = torch.relu(x @ w.t())
        torch._dynamo.graph_break()
        return a, torch.relu(y @ w.t())

    one, two = torch.randn(1, 64, dtype=BF16), torch.randn(2, 64, dtype=BF16)
    on, off, user = (True, True), (False, False), (False, True)  # the user's: descent alone
    for user_flag, args, expected in ((False, (one, two), [on, off]),
                                      (False, (two, one), [off, on]),
                                      (False, (two, two), [off, off]),
                                      (True, (two, one), [user, on])):
        torch._dynamo.reset()
        seen.clear()
        with inductor_config.patch({"fx_graph_cache": False, "triton.cudagraphs": True,
                                    "coordinate_descent_tuning": user_flag,
                                    "post_grad_custom_post_pass": recording}):
            run_and_get_code(torch.compile(fn), *args)
            assert seen == expected
            assert tuple(getattr(inductor_config, n) for n in REDUCTION_TUNING) == (
                user if user_flag else off)


def test_gemv_tuning_is_decided_per_graph_and_never_inside_a_capture(monkeypatch):
    """Within one compile (no end callback between them) the next graph's pass turns the
    tuning off for a graph without a GEMV; a GEMV compiled inside a stream capture, or by a
    pass told not to tune, is not tuned (in a capture its benchmarks would run inside it);
    ``disable()`` turns off what a compile without Dynamo's end callback left on."""
    from cutetune.tuner.inductor import passes
    from cutetune.tuner.inductor.passes import REDUCTION_TUNING

    flags = lambda: tuple(getattr(inductor_config, n) for n in REDUCTION_TUNING)  # noqa: E731
    gemv = GemvPass("k", lambda device: "sm90")
    w = torch.randn(48, 64, dtype=BF16)

    def graph(m):
        gm = torch.fx.experimental.proxy_tensor.make_fx(
            lambda x, w: torch.ops.aten.mm.default(x, w.t()), tracing_mode="fake")(
                torch.randn(m, 64, dtype=BF16), w)
        return gm.graph

    with inductor_config.patch({"triton.cudagraphs": True}):
        gemv(graph(1))
        assert flags() == (True, True)
        gemv(graph(2))
        assert flags() == (False, False)
        gemv(graph(1))
        assert flags() == (True, True)
        iin.enable("predicted").disable()
        assert flags() == (False, False)
        untuned = GemvPass("k", lambda device: "sm90", tune=False)
        one_row = graph(1)
        untuned(one_row)
        assert flags() == (False, False)
        assert not one_row.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
    monkeypatch.setattr(passes, "under_cuda_graphs", lambda: True)  # a capture in progress
    one_row = graph(1)
    gemv(one_row)
    assert flags() == (False, False)
    assert not one_row.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
