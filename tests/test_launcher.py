"""The quack GEMM launcher: its support envelope (pure), the ATen fallback (CPU), and numerics
against torch on a GPU (``-m gpu``)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from cutetune.tuner.kernels import problems
from cutetune.space.config import KernelConfig, quack_default_config
from cutetune.space.problem import GemmProblem, ProblemError
from cutetune.tuner.kernels import launcher, quack_gemm
from cutetune.tuner.kernels.launcher import quack_mm_out
from cutetune.tuner.kernels.problems import addend_kind, check_out, gemm_problem

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def problem_of(a, b, arch="sm90"):
    return gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.dtype, arch)


# ---------------------------------------------------------------- support envelope
@pytest.mark.parametrize("a, b, majors", [
    (meta(64, 256), meta(256, 512), ("k", "n")),          # x @ W
    (meta(64, 256), meta(512, 256).t(), ("k", "k")),      # x @ W.t(): nn.Linear
    (meta(256, 64).t(), meta(256, 512), ("m", "n")),      # grad_W = x.t() @ dy
    (meta(256, 64).t(), meta(512, 256).t(), ("m", "k")),
])
def test_majors_follow_the_contiguous_dim(a, b, majors):
    p = problem_of(a, b)
    assert (p.a_major, p.b_major) == majors
    assert (p.m, p.n, p.k, p.batch) == (64, 512, 256, 1)


def test_bmm_problem_has_batch():
    p = problem_of(meta(8, 64, 128), meta(8, 128, 32))
    assert (p.batch, p.m, p.n, p.k) == (8, 64, 32, 128)


@pytest.mark.parametrize("a, b, arch, match", [
    (meta(64, 256, dtype=torch.float32), meta(256, 512, dtype=torch.float32), "sm90", "dtype"),
    (meta(64, 100), meta(100, 512), "sm90", "aligned leading stride"),   # K misaligned
    (meta(64, 104)[:, :100], meta(100, 512), "sm90", "multiple of 8"),   # padded, K still odd
    (meta(64, 512)[:, ::2], meta(256, 512), "sm90", "no contiguous dim"),
    (meta(64, 264)[:, :256], meta(256, 512), "sm90", None),            # padded rows: fine
    (meta(64, 261)[:, :256], meta(256, 512), "sm90", "no contiguous dim"),  # unaligned rows
    (torch.empty_strided((3, 8, 64), (516, 64, 1), dtype=BF16, device="meta"),
     meta(3, 64, 64), "sm90", "batch strides"),                         # 516 * 2 B % 16 != 0
    (meta(64, 256), meta(128, 512), "sm90", "do not multiply"),
    (meta(64, 256), meta(256, 512), None, "sm90 or sm100"),
])
def test_unsupported_operands_name_the_reason(a, b, arch, match):
    if match is None:
        assert problem_of(a, b, arch).k == 256
        return
    with pytest.raises(ProblemError, match=match):
        problem_of(a, b, arch)


def test_output_must_be_row_major():
    check_out((64, 512), (512, 1), BF16)
    with pytest.raises(ProblemError, match="row-major"):
        check_out((64, 512), (1, 64), BF16)


@pytest.mark.parametrize("size, stride, beta, kind", [
    ((512,), (1,), 1, "bias"),
    ((1, 512), (512, 1), 1, "bias"),
    ((64, 512), (0, 1), 1, "bias"),       # Inductor's expanded bias
    ((64, 512), (512, 1), 0.5, "c"),
    ((64, 512), (1, 64), 0, None),        # beta == 0 ignores the input, whatever it is
])
def test_addend_kind(size, stride, beta, kind):
    assert addend_kind(size, stride, BF16, BF16, 64, 512, beta) == kind


@pytest.mark.parametrize("size, stride, dtype, beta, match", [
    ((512,), (1,), BF16, 2.0, "unscaled"),
    ((64, 1), (1, 1), BF16, 1, "neither"),           # column broadcast
    ((64, 512), (1, 64), BF16, 1, "neither"),        # column-major C
    ((64, 512), (512, 1), torch.float32, 1, "differs"),
])
def test_addend_kind_rejects(size, stride, dtype, beta, match):
    with pytest.raises(ProblemError, match=match):
        addend_kind(size, stride, dtype, BF16, 64, 512, beta)


def test_unsupported_reason_on_tensors(monkeypatch):
    a, b, out = meta(64, 256), meta(512, 256).t(), meta(64, 512)
    cfg = quack_default_config("sm90")
    assert "sm90 or sm100" in launcher.unsupported_reason(a, b, out, cfg)  # not a GPU
    assert "different devices" in launcher.unsupported_reason(
        a, torch.empty(256, 512, dtype=BF16), out, cfg)
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    assert launcher.unsupported_reason(a, b, out, cfg) is None
    assert launcher.unsupported_reason(a, b, out, cfg, c=meta(512)) is None
    split4 = KernelConfig(64, 128, True, 1, 1, False, 8, 4, False)
    assert "split_k_has_k_tiles" in launcher.unsupported_reason(meta(64, 128), meta(128, 512),
                                                                out, split4)
    assert "addmm" in launcher.unsupported_reason(meta(2, 64, 256), meta(2, 256, 512),
                                                  meta(2, 64, 512), cfg, c=meta(512))
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm100")  # an sm90 config there
    assert "sm100_no_pingpong" in launcher.unsupported_reason(a, b, out, cfg)


def test_config_tuple_round_trips():
    c = KernelConfig(64, 96, False, 1, 2, True, 1, 2, False)
    assert problems.as_config(problems.config_tuple(c)) == c
    assert problems.as_config(c) is c


# ---------------------------------------------------------------- ATen fallback (CPU)
def _ref(a, b, c=None, alpha=1.0, beta=1.0):
    r = torch.matmul(a.float(), b.float()) * alpha
    return r if c is None else r + beta * c.float()


@pytest.mark.parametrize("case", ["mm", "mm_t", "bmm", "bias", "c", "alpha_only"])
def test_cpu_tensors_fall_back_to_aten(case):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 64, generator=g, dtype=BF16)
    b = torch.randn(64, 48, generator=g, dtype=BF16)
    c, alpha, beta = None, 1.0, 1.0
    if case == "mm_t":
        b = torch.randn(48, 64, generator=g, dtype=BF16).t()
    elif case == "bmm":
        a, b = torch.randn(3, 32, 64, generator=g, dtype=BF16), torch.randn(3, 64, 48, dtype=BF16)
    elif case == "bias":
        c = torch.randn(48, generator=g, dtype=BF16)
    elif case == "c":
        c, alpha, beta = torch.randn(32, 48, generator=g, dtype=BF16), 0.5, 2.0
    elif case == "alpha_only":
        alpha = 3.0
    out = torch.empty(*a.shape[:-1], b.shape[-1], dtype=BF16)
    got = quack_mm_out(a, b, out, quack_default_config("sm90"), c=c, alpha=alpha, beta=beta)
    assert got is out
    torch.testing.assert_close(out.float(), _ref(a, b, c, alpha, beta), rtol=2e-2, atol=2e-1)


class RecordingQuack:
    """Stands in for quack's entry point: binds each call to the real ``_gemm_execute``
    signature (quack API drift fails here, on CPU) and returns a dispatch-plan token."""

    def __init__(self, fail=False):
        import inspect

        from quack.gemm_interface import _gemm_execute

        self.signature, self.fail, self.calls = inspect.signature(_gemm_execute), fail, []

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        self.calls.append(bound.arguments)
        if self.fail:
            raise RuntimeError("kernel does not compile")
        return ("plan", len(self.calls))


@pytest.fixture
def sm90_meta(monkeypatch):
    """Meta tensors on a pretend sm90: quack_mm_out runs its quack path up to the launch."""
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    launcher._plans.clear()
    yield
    launcher._plans.clear()


def test_launch_routes_operands_and_reuses_the_dispatch_plan(sm90_meta, monkeypatch):
    rec = RecordingQuack()
    monkeypatch.setattr(quack_gemm, "_quack", lambda: (rec, "SERIAL", "RN"))
    a, w, out = meta(64, 256), meta(512, 256), meta(64, 512)
    cfg = problems.config_tuple(KernelConfig(64, 128, True, 1, 1, False, 8, 2, False))
    for _ in range(2):
        quack_mm_out(a, w.t(), out, cfg)
    first, second = rec.calls
    assert first["dispatch_plan"] is None and second["dispatch_plan"] == ("plan", 1)
    assert first["split_k"] == 2 and first["config"].tile_m == 64 and first["C"] is None
    bias = meta(64, 512).as_strided((64, 512), (0, 1))  # Inductor's expanded bias
    quack_mm_out(a, w.t(), out, cfg, c=bias)
    assert tuple(rec.calls[-1]["bias"].shape) == (512,) and rec.calls[-1]["C"] is None
    c = meta(64, 512)
    quack_mm_out(a, w.t(), out, cfg, c=c, alpha=0.5, beta=2.0)
    last = rec.calls[-1]
    assert last["C"] is c and last["bias"] is None and (last["alpha"], last["beta"]) == (0.5, 2.0)


def test_a_config_that_fails_to_launch_retires_to_aten(sm90_meta, monkeypatch):
    rec = RecordingQuack(fail=True)
    monkeypatch.setattr(quack_gemm, "_quack", lambda: (rec, "SERIAL", "RN"))
    a, b, out = meta(64, 256), meta(256, 512), meta(64, 512)
    cfg = problems.config_tuple(quack_default_config("sm90"))
    assert quack_mm_out(a, b, out, cfg) is out  # ATen's meta mm ran instead
    quack_mm_out(a, b, out, cfg)
    assert len(rec.calls) == 1  # retired: not tried again


def test_concurrent_first_uses_import_quack_once(monkeypatch, caplog):
    """The background import and a first launch asking at once: one import, one log line."""
    import logging
    import threading

    monkeypatch.setattr(quack_gemm, "_QUACK", None)
    got = []
    with caplog.at_level(logging.INFO, logger=quack_gemm.log.name):
        threads = [threading.Thread(target=lambda: got.append(quack_gemm._quack()))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert len(got) == 2 and got[0] is got[1]
    assert sum("imported quack" in r.getMessage() for r in caplog.records) == 1


def test_background_import_starts_once_and_logs_a_failure(monkeypatch, caplog):
    calls = []

    def failing_import():
        calls.append(1)
        raise ImportError("no quack here")

    monkeypatch.setattr(quack_gemm, "_quack", failing_import)
    quack_gemm.import_quack_in_background.cache_clear()
    try:
        thread = quack_gemm.import_quack_in_background()
        thread.join(timeout=10)
        assert quack_gemm.import_quack_in_background() is thread  # once per process
    finally:
        quack_gemm.import_quack_in_background.cache_clear()
    assert calls == [1] and not thread.is_alive()
    assert "background import for quack failed (ImportError: no quack here)" in caplog.text


GPU_BLIND_LAUNCHES = textwrap.dedent("""
    import sys, torch
    from cutetune.tuner.kernels.compile import configure_gpu_blind
    configure_gpu_blind("sm90", sys.argv[1])
    from cutetune.space.config import KernelConfig, quack_default_config
    from cutetune.tuner.kernels import launcher, problems, quack_gemm
    problems.device_arch = lambda device: "sm90"
    bf = dict(dtype=torch.bfloat16)
    a, w, out = torch.randn(64, 256, **bf), torch.randn(512, 256, **bf), torch.empty(64, 512, **bf)
    default, swap = quack_default_config("sm90"), KernelConfig(128, 128, False, 1, 1, True, 1, 1)
    split = KernelConfig(64, 128, True, 1, 1, False, 8, 2)
    x, y, out3 = torch.randn(4, 64, 256, **bf), torch.randn(4, 256, 512, **bf), torch.empty(
        4, 64, 512, **bf)
    cases = [(a, w.t(), out, default, None, 1.0), (a, w.t(), out, default, torch.randn(512, **bf),
             1.0), (a, w.t(), out, default, torch.randn(64, 512, **bf), 2.0),
             (a, w.t(), out, swap, torch.randn(512, **bf), 1.0), (x, y, out3, split, None, 1.0)]
    for a_, b_, o_, cfg, c, beta in cases:
        plan = launcher._build_plan(a_, b_, o_, cfg, c, 1.0, beta)
        assert plan.config is not None, launcher.unsupported_reason(a_, b_, o_, cfg, c, beta)
        assert (plan.library is not None) == (c is None and a_.dim() == 2)  # a plain 2D mm
        try:
            quack_gemm.launch(plan, a_, b_, o_, c, 1.0, beta)
        except Exception as e:  # no GPU: loading the compiled kernel is as far as it gets
            print(type(e).__name__, str(e)[:200])
    print(len(cases))
""")


@pytest.mark.compile
def test_quack_compiles_each_launch_variant_gpu_blind(tmp_path, run_script):
    """Every operand routing the launcher uses (mm, row bias, C with beta, swap_ab with bias,
    batched split-K) goes through quack's real entry point up to a compiled kernel."""
    cache = tmp_path / "quack_cache"
    assert run_script(GPU_BLIND_LAUNCHES, cache) == 5
    assert len(list(cache.rglob("*.o"))) == 5  # one kernel per variant


def test_extern_choices_register_once():
    from torch._inductor.select_algorithm import extern_kernels

    first = launcher.extern_choices()
    assert launcher.extern_choices() is first
    for name in (launcher.MM_KERNEL, launcher.ADDMM_KERNEL):
        assert getattr(extern_kernels, name) is first[name].to_callable()


# ---------------------------------------------------------------- GPU numerics
gpu = pytest.mark.gpu


def _cuda(*shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=BF16)


GPU_CONFIGS = [
    quack_default_config("sm90"),
    KernelConfig(128, 128, False, 1, 1, True, 1, 1, False),   # cooperative, swap_ab
    KernelConfig(64, 128, True, 1, 1, False, 8, 2, False),    # split-K
]


@gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_gpu_mm_matches_torch(config, layout):
    m, n, k = 304, 520, 384  # ragged against every tile
    a = _cuda(m, k) if layout[0] == "n" else _cuda(k, m).t()
    b = _cuda(k, n, seed=1) if layout[1] == "n" else _cuda(n, k, seed=1).t()
    out = torch.empty(m, n, device="cuda", dtype=BF16)
    assert launcher.unsupported_reason(a, b, out, config) is None  # quack runs it, not ATen
    quack_mm_out(a, b, out, problems.config_tuple(config))
    quack_mm_out(a, b, out, problems.config_tuple(config))  # warm path: cached dispatch plan
    torch.testing.assert_close(out, torch.mm(a, b), rtol=2e-2, atol=2e-2)


@gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.short())
def test_gpu_addmm_and_bmm_match_torch(config):
    a, w = _cuda(200, 256), _cuda(384, 256, seed=1)
    bias, c = _cuda(384, seed=2), _cuda(200, 384, seed=3)
    out = torch.empty(200, 384, device="cuda", dtype=BF16)
    assert launcher.unsupported_reason(a, w.t(), out, config, c=bias) is None
    assert launcher.unsupported_reason(a, w.t(), out, config, c=c, beta=2.0) is None
    quack_mm_out(a, w.t(), out, config, c=bias)
    torch.testing.assert_close(out, torch.addmm(bias, a, w.t()), rtol=2e-2, atol=2e-2)
    quack_mm_out(a, w.t(), out, config, c=c, alpha=0.5, beta=2.0)
    torch.testing.assert_close(out, torch.addmm(c, a, w.t(), alpha=0.5, beta=2.0),
                               rtol=2e-2, atol=5e-2)
    x, y = _cuda(6, 128, 256), _cuda(6, 192, 256, seed=1).transpose(1, 2)
    out3 = torch.empty(6, 128, 192, device="cuda", dtype=BF16)
    assert launcher.unsupported_reason(x, y, out3, config) is None
    quack_mm_out(x, y, out3, config)
    torch.testing.assert_close(out3, torch.bmm(x, y), rtol=2e-2, atol=2e-2)


@gpu
def test_gpu_unaligned_pointer_and_fp32_fall_back():
    cfg = quack_default_config("sm90")
    buf = _cuda(64 * 256 + 8)
    a = buf[1:1 + 64 * 256].view(64, 256)  # 2-byte offset: TMA cannot take it
    b = _cuda(256, 512, seed=1)
    out = torch.empty(64, 512, device="cuda", dtype=BF16)
    quack_mm_out(a, b, out, cfg)
    assert torch.equal(out, torch.mm(a, b))  # bit-identical: it ran cuBLAS
    a32, b32 = a.float(), b.float()
    out32 = torch.empty(64, 512, device="cuda")
    quack_mm_out(a32, b32, out32, cfg)
    assert torch.equal(out32, torch.mm(a32, b32))


BUILD_PLAIN_LIBRARIES = textwrap.dedent("""
    import json, sys
    from cutetune.tuner.kernels.compile import configure_gpu_blind
    arch = sys.argv[3]
    configure_gpu_blind(arch, sys.argv[1])
    from cutetune.space.config import KernelConfig
    from cutetune.space.problem import GemmProblem
    from cutetune.tuner.kernels import library as gemm_library
    for fields, majors in json.loads(sys.argv[2]):
        problem = GemmProblem(256, 256, 256, a_major=majors[0], b_major=majors[1], arch=arch)
        gemm_library.build_library(problem, KernelConfig(**fields))
    print(json.dumps("built"))
""")

LAUNCH_PLAIN_LIBRARIES = textwrap.dedent("""
    import json, sys, torch
    from cutetune.space.config import KernelConfig
    from cutetune.tuner.kernels import launcher, problems, quack_gemm
    g = torch.Generator(device="cuda").manual_seed(0)
    out = {"via": [], "errors": []}
    for fields, majors in json.loads(sys.argv[1]):
        m, n, k = 1000, 1536, 2048  # ragged against the tiles
        rand = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.bfloat16)
        a = rand(m, k) if majors[0] == "k" else rand(k, m).t()
        b = rand(k, n) if majors[1] == "n" else rand(n, k).t()
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):  # the first launch loads the library, the second replays it
            launcher.quack_mm_out(a, b, d, KernelConfig(**fields))
        ref = a.float() @ b.float()
        out["errors"].append(((d.float() - ref).norm() / ref.norm()).item())
        out["via"] += [p.via for p in launcher._plans.values() if p.via]
        launcher._plans.clear()
    out["imported"] = [name for name in ("cutlass", "quack") if name in sys.modules]
    print(json.dumps(out))
""")


@gpu
def test_gpu_mm_runs_from_its_library_without_quack(tmp_path, run_script):
    """Plain mm libraries built GPU-blind in another process (as the compile helper builds
    them) run right for quack's default config (2x1 cluster), a swap_ab config and an "m"-major
    A with an "n"-major B, in a fresh process that imports neither quack nor cutlass."""
    import json

    arch = problems.device_arch(torch.device("cuda"))
    jobs = [(quack_default_config(arch), "kk"), (GPU_CONFIGS[1], "kk"),
            (GPU_CONFIGS[1], "mn"), (quack_default_config(arch), "mn")]
    spec = json.dumps([(c.to_dict(), m) for c, m in jobs])
    assert run_script(BUILD_PLAIN_LIBRARIES, tmp_path / "quack", spec, arch) == "built"
    got = run_script(LAUNCH_PLAIN_LIBRARIES, spec)
    assert got["imported"] == [] and got["via"] == ["library"] * len(jobs), got
    assert max(got["errors"]) < 1e-2, got


PLAN_WITHOUT_QUACK = textwrap.dedent("""
    import json, sys, torch
    from cutetune.space.config import quack_default_config
    from cutetune.tuner.kernels import launcher, problems, quack_gemm
    problems.device_arch = lambda device: "sm90"
    bf = dict(dtype=torch.bfloat16)
    a, w, out = torch.randn(64, 256, **bf), torch.randn(512, 256, **bf), torch.empty(64, 512, **bf)
    plan = launcher._build_plan(a, w.t(), out, quack_default_config("sm90"), None, 1.0, 1.0)
    print(json.dumps([plan.library is not None,
                      [m for m in ("quack", "cutlass", "sympy") if m in sys.modules]]))
""")


def test_a_call_is_planned_without_importing_quack(run_script):
    """Planning a call (support checks, the library key) imports neither quack nor cutlass:
    a call its library serves must not pay their import (seconds) at all; nor sympy, which
    only Inductor's symbolic sizes need (0.5 s of an eager first call)."""
    assert run_script(PLAN_WITHOUT_QUACK) == [True, []]


SIGNATURE_AGAINST_QUACK = textwrap.dedent("""
    import json, sys
    from cutetune.tuner.kernels.compile import configure_gpu_blind, kernel_object_path
    configure_gpu_blind("sm90", sys.argv[1])
    from cutetune.space.config import KernelConfig
    from cutetune.space.problem import GemmProblem
    from cutetune.tuner.kernels import library as gemm_library
    out = []
    for fields, problem in json.loads(sys.argv[2]):
        config, problem = KernelConfig(**fields), GemmProblem(**problem)  # as a job line reads
        gemm_library._cpu_plan(problem, config, 1)  # quack's own call compiles into its cache
        out.append(kernel_object_path(problem, config).exists())
    print(json.dumps(out))
""")


@pytest.mark.compile
def test_kernel_signature_finds_the_kernel_quacks_own_call_compiled(tmp_path, run_script):
    """The file ``kernel_object_path`` names (where the compile helper's kernel goes, and what
    reduced mode waits for) is the one quack's own call compiles and looks up, also for a
    problem read from JSON with an "n"-major B (whose "n" beside D's hashed apart once: quack's
    key pickles its arguments, and pickle tells equal strings apart by identity)."""
    import json

    jobs = [(GPU_CONFIGS[0], GemmProblem(512, 1024, 2048, b_major="n")),
            (GPU_CONFIGS[1], GemmProblem(512, 1024, 2048, a_major="m", b_major="n"))]
    assert run_script(SIGNATURE_AGAINST_QUACK, tmp_path,
                      json.dumps([(c.to_dict(), p.to_dict()) for c, p in jobs])) == [True, True]


ROUTING_AGAINST_QUACK = textwrap.dedent("""
    import json, sys, torch
    from cutetune.tuner.kernels.compile import configure_gpu_blind
    configure_gpu_blind("sm90", sys.argv[1])
    import quack.gemm as qgemm
    from cutetune.space.config import KernelConfig
    from cutetune.space.problem import GemmProblem
    from cutetune.tuner.kernels import aot, library as gemm_library, launcher, quack_gemm

    def views(*tensors):
        return [None if t is None else [list(t.shape), list(t.stride())] for t in tensors]

    bf, (m, n, k), out = torch.bfloat16, (256, 384, 128), []
    qgemm.get_max_active_clusters = lambda *args, **kwargs: 1
    for fields, majors in json.loads(sys.argv[2]):
        config, seen = KernelConfig(**fields), {}
        problem = GemmProblem(m, n, k, a_major=majors[0], b_major=majors[1])
        gemm_library.build_library(problem, config)  # (first: it compiles into a scratch folder)
        a = torch.empty(m, k, dtype=bf) if majors[0] == "k" else torch.empty(k, m, dtype=bf).t()
        b = torch.empty(k, n, dtype=bf) if majors[1] == "n" else torch.empty(n, k, dtype=bf).t()
        d = torch.empty(m, n, dtype=bf)
        qgemm.launch_gemm = lambda plan, A, B, D, C, *rest: seen.setdefault(
            "quack", views(A, B, D, C))
        quack_gemm.quack_kernel(config, "sm90")(a, b, d)  # quack's own routing, up to its launch
        key = gemm_library.library_key(problem, config)
        meta = json.loads(aot.library_paths(key)[1].read_text())
        lib = aot.Library.__new__(aot.Library)  # its routing, the loaded function stood in for
        lib.fn = lambda A, B, D, C, *tail: seen.setdefault("library", views(A, B, D, C))
        lib.b_kn, lib.swapped = meta["b_kn"], meta["swapped"]
        lib.d_transposed, lib.tail = meta["d_transposed"], ()
        lib.launch(a, b, d, None)
        out.append([seen["quack"], seen["library"]])
    print(json.dumps(out))
""")


@pytest.mark.compile
def test_a_library_gets_the_operands_as_quack_hands_them_to_its_kernel(tmp_path, run_script):
    """What the library's launch passes to the compiled function (operand order, views,
    shapes, strides) is what quack's own path passes to the same function: unswapped and
    swap_ab (A and B exchanged, D transposed), with "k"/"k" and "m"/"n" majors."""
    import json

    jobs = [(quack_default_config("sm90"), "kk"), (GPU_CONFIGS[1], "kk"), (GPU_CONFIGS[1], "mn"),
            (quack_default_config("sm90"), "mn")]
    got = run_script(ROUTING_AGAINST_QUACK, tmp_path,
                     json.dumps([(c.to_dict(), m) for c, m in jobs]))
    for (quack, library), (config, _) in zip(got, jobs):
        assert library == quack, config.short()
    assert got[1][0][2] == [[384, 256], [1, 384]]  # swapped: D crosses transposed (m-major)
