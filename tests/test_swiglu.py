"""The fused SwiGLU GEMM (tuner/swiglu.py) and the post-grad pass that puts it into graphs
(tuner/inductor/passes.py): rewrites, decisions and the ATen fallback on the CPU; quack's fused
kernel on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import run_and_get_code

from cutetune.models import heuristics as hz
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GemmProblem
from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
from cutetune.tuner.kernels import problems
from cutetune.models import triton_mm as tmm
from cutetune.tuner.kernels import pointwise, helper as prefetch, swiglu
from cutetune.tuner.inductor.passes import SwigluFusionPass
from cutetune.models.heuristics import PackagedHeuristics
from cutetune.artifacts import sealed_json

BF16 = torch.bfloat16
DATA = Path(__file__).resolve().parent.parent / "data"
SPLIT = KernelConfig(tile_m=128, tile_n=128, split_k=2)
PLAIN = KernelConfig(tile_m=128, tile_n=128, pingpong=False)


def P(m, n=14336, k=4096):
    return GemmProblem(m=m, n=n, k=k, dtype="bf16", out_dtype="bf16", a_major="k", b_major="k",
                       arch="sm90")


class Table:
    """A heuristics stand-in: these configs for every problem."""

    def __init__(self, *configs):
        self.configs = configs

    def lookup(self, problem):
        return self.configs, True


def _mlp(dtype, inter=64, hidden=32, order="gate_first"):
    g = torch.Generator().manual_seed(0)
    wg, wu, wd = (torch.randn(s, generator=g, dtype=dtype) / 8
                  for s in ((inter, hidden), (inter, hidden), (hidden, inter)))

    def mlp(x):
        gate, up = F.linear(x, wg), F.linear(x, wu)
        h = F.silu(gate) * up if order == "gate_first" else up * F.silu(gate)
        return F.linear(h, wd)

    return mlp


def _compile(fn, x, fusion_pass):
    torch._dynamo.reset()
    prev = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = fusion_pass
    try:
        with inductor_config.patch(fx_graph_cache=False):
            out, code = run_and_get_code(torch.compile(fn), x)
    finally:
        inductor_config.post_grad_custom_post_pass = prev
    return out, "".join(code)


@pytest.mark.parametrize("order", ["gate_first", "up_first"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pass_rewrites_silu_times_mm_into_the_fused_op(dtype, order):
    """Both operand orders and both 16-bit dtypes match (the pattern is traced from silu, as
    this torch decomposes it); the graph's result stays right (on the CPU the op runs ATen)."""
    fusion = SwigluFusionPass(lambda p: PLAIN, "k", lambda device: "sm90")
    mlp, x = _mlp(dtype, order=order), torch.randn(16, 32, dtype=dtype)
    out, code = _compile(mlp, x, fusion)
    assert f"extern_kernels.{swiglu.MM_SILU_MUL_KERNEL}(" in code
    assert [(p.m, p.n, p.k) for p, _ in fusion.fused] == [(16, 64, 32)]
    assert fusion.fused[0][1] == PLAIN
    ref = mlp(x)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


def test_a_dynamic_m_fuses_per_range_of_m_without_recompiling():
    """Compiled with a dynamic M (what Dynamo does once a new batch or sequence length
    arrives), the up projection is fused where the decision fuses its range's rung and left
    unfused elsewhere, chosen per call by its M; every M runs right in the one graph."""
    asked = []

    def decide(p):
        asked.append(p.m)
        return PLAIN if p.m >= 64 else None

    fusion = SwigluFusionPass(decide, "k", lambda device: "sm90")
    mlp = _mlp(BF16)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    prev = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = fusion
    try:
        with inductor_config.patch(fx_graph_cache=False):
            fn, x = torch.compile(mlp), torch.randn(16, 32, dtype=BF16)
            torch._dynamo.mark_dynamic(x, 0)  # M alone, as for a new batch size
            code = run_and_get_code(fn, x)[1]
            for m in (2, 45, 46, 300):  # 45: rung 32's range (45 * 45 <= 2 * 32 * 32); 46: 64's
                # (M=1 would compile a graph of its own: Dynamo specializes sizes 0 and 1)
                x = torch.randn(m, 32, dtype=BF16)
                ref = mlp(x)
                assert ((fn(x).float() - ref.float()).norm() / ref.float().norm()) < 1e-2
            assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    finally:
        inductor_config.post_grad_custom_post_pass = prev
    assert f"extern_kernels.{swiglu.MM_SILU_MUL_BY_M_KERNEL}(" in "".join(code)
    assert asked == [2 ** i for i in range(16)]
    assert [(p.m, p.n, p.k, c) for p, c in fusion.fused] == [(64, 64, 32, PLAIN)]
    table = ((45, None), (ich.launcher.M_UNBOUNDED, problems.config_tuple(PLAIN)))
    assert f"table={table!r}" in "".join(code)


def test_a_host_bound_rung_of_a_dynamic_m_fuses():
    """Host-bound and not measured, an up projection is left unfused in a static graph
    (Inductor's pointwise kernel is one launch), but fused at a rung of a dynamic M, whose
    unfused path is launches of its own; above the host-bound limit both decide alike."""
    table = Table(SPLIT, PLAIN)
    assert idec.decide_swiglu(P(16), table, 48.0) is None
    assert idec.decide_swiglu(P(16), table, 48.0, dynamic_m=True) == PLAIN
    assert idec.decide_swiglu(P(4096), table, 48.0) == PLAIN
    assert idec.decide_swiglu(P(4096), table, 48.0, dynamic_m=True) == PLAIN


class Measured(Table):
    """A heuristics stand-in with a SwiGLU table: problem -> the measured fused config or
    None (unfused measured faster)."""

    def __init__(self, fusions, *configs):
        super().__init__(*configs)
        self.fusions = fusions

    def swiglu_config(self, problem):
        return problem in self.fusions, self.fusions.get(problem)


def test_a_host_bound_static_up_projection_fuses_only_where_the_gpu_measured_it():
    """In a static graph a host-bound up projection fuses where the SwiGLU table measured
    the fused kernel faster, with the measured config; measured slower or not measured, it
    stays unfused. A dynamic M's rung takes the measurement where there is one too."""
    fast = KernelConfig(tile_m=64, tile_n=128, pingpong=False, cluster_m=1, cluster_n=1)
    table = Measured({P(16): fast, P(128): None}, SPLIT, PLAIN)
    assert idec.decide_swiglu(P(16), table, 48.0) == fast
    assert idec.decide_swiglu(P(128), table, 48.0) is None
    assert idec.decide_swiglu(P(1), table, 48.0) is None
    assert idec.decide_swiglu(P(1), table, 48.0, dynamic_m=True) == PLAIN
    assert idec.decide_swiglu(P(128), table, 48.0, dynamic_m=True) is None
    assert idec.decide_swiglu(P(16), table, 48.0, dynamic_m=True) == fast


DYNAMIC_M_FRESH_PROCESS = """
import json, torch, torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from cutetune.space.config import KernelConfig
from cutetune.tuner.inductor.passes import SwigluFusionPass
g = torch.Generator().manual_seed(0)
wg, wu, wd = (torch.randn(s, generator=g, dtype=torch.bfloat16) / 8
              for s in ((64, 32), (64, 32), (32, 64)))
mlp = lambda x: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
plain = KernelConfig(tile_m=128, tile_n=128, pingpong=False)
inductor_config.post_grad_custom_post_pass = SwigluFusionPass(
    lambda p: plain if p.m >= 64 else None, "k", lambda device: "sm90")
fn, x = torch.compile(mlp), torch.randn(16, 32, dtype=torch.bfloat16)
torch._dynamo.mark_dynamic(x, 0)
fn(x)
errs = []
for m in (2, 300):
    xm = torch.randn(m, 32, dtype=torch.bfloat16)
    ref = mlp(xm)
    errs.append(((fn(xm).float() - ref.float()).norm() / ref.float().norm()).item())
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"]
                  + counters["aot_autograd"]["autograd_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"], "err": max(errs)}))
"""


def test_a_dynamic_m_graph_reloads_from_the_fx_graph_cache_in_a_fresh_process(tmp_path,
                                                                                run_script):
    """Code calling the by-M fused kernel (its table a literal) runs every M right after a
    reload from Inductor's FX-graph cache in a fresh process, whose fusion pass registers
    the kernel by name (on the CPU the kernel runs ATen)."""
    _reload_from_the_fx_graph_cache(run_script, DYNAMIC_M_FRESH_PROCESS, tmp_path,
                                    swiglu.MM_SILU_MUL_BY_M_KERNEL, 1e-2)


def _reload_from_the_fx_graph_cache(run_script, script: str, tmp_path, kernel: str,
                                    tolerance: float) -> None:
    """Run ``script`` twice in fresh processes sharing an FX-graph cache: the first misses,
    the second hits and misses nothing, both within ``tolerance`` of eager, and the cached
    code calls ``extern_kernels.<kernel>``."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    runs = [run_script(script, env=env) for _ in range(2)]
    assert runs[0]["miss"] >= 1 and runs[1]["hit"] >= 1 and runs[1]["miss"] == 0
    assert all(r["err"] < tolerance for r in runs)
    cached = "".join(p.read_text() for p in (tmp_path / "inductor").rglob("*.py"))
    assert f"extern_kernels.{kernel}(" in cached


def test_the_by_m_op_fuses_the_range_that_holds_m():
    table = ((4, None), (ich.launcher.M_UNBOUNDED, PLAIN))
    for m in (3, 8):
        a, b, gate = torch.randn(m, 16), torch.randn(16, 4), torch.randn(m, 4)
        torch.testing.assert_close(
            torch.ops.cutetune.mm_silu_mul_by_m(a, b, gate, problems.table_ints(table)),
            F.silu(gate) * (a @ b))
    assert problems.parsed_table((problems.table_ints(table))) == table


def test_pass_leaves_graphs_it_should_not_fuse():
    """No fusion where the decision says None, for fp32 (quack runs 16-bit types), or where
    the device is not one quack runs on; the graph compiles as Inductor's own."""
    for decide, arch, dtype in ((lambda p: None, "sm90", BF16),
                                (lambda p: PLAIN, "sm90", torch.float32),
                                (lambda p: PLAIN, None, BF16)):
        fusion = SwigluFusionPass(decide, "k", lambda device, a=arch: a)
        _, code = _compile(_mlp(dtype), torch.randn(16, 32, dtype=dtype), fusion)
        assert "mm_silu_mul" not in code and not fusion.fused


class Shapes:
    """The problems of these (M, N, K), whatever their layout: a ``templated`` answer."""

    def __init__(self, *mnk):
        self.mnk = set(mnk)

    def __contains__(self, p):
        return (p.m, p.n, p.k) in self.mnk


def test_pass_leaves_a_templated_up_projection_to_its_triton_template():
    """A static up projection whose problem the graph's Triton weighing takes stays unfused
    (a template takes the product as its epilogue); another is fused. The weighing is asked
    once per graph, with quack's arch and the graph as it came (all three mm)."""
    for templated, fused in ((Shapes((16, 64, 32)), False), (Shapes((16, 32, 64)), True)):
        asked = []

        def ask(graph, arch, answer=templated):
            asked.append((arch, len(graph.find_nodes(op="call_function",
                                                     target=torch.ops.aten.mm.default))))
            return answer

        fusion = SwigluFusionPass(lambda p: PLAIN, "k", lambda device: "sm90", templated=ask)
        mlp, x = _mlp(BF16), torch.randn(16, 32, dtype=BF16)
        out, code = _compile(mlp, x, fusion)
        assert ("mm_silu_mul" in code) is fused and bool(fusion.fused) is fused
        assert asked == [("sm90", 3)]
        ref = mlp(x)
        assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


def test_the_packaged_weighing_templates_the_llama_mlps_up_projection_where_host_bound():
    """With the shipped heuristics the Llama-3-8B MLP's static graph gives its up (and gate)
    problem a Triton template at M 1, 16 and 128, so the fusion pass leaves it unfused there
    (``triton_takers``, as the lowering weighs the graph), and none from M=256."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def mlp(x, wg, wu, wd):
        return torch.mm(F.silu(torch.mm(x, wg.t())) * torch.mm(x, wu.t()), wd.t())

    heuristics = PackagedHeuristics()
    installation = iin.enable("predicted")  # the installed pass asks the same weighing
    try:
        installed = _swiglu_pass().templated
        for m, templated in ((1, True), (16, True), (128, True), (256, False), (2048, False)):
            args = [torch.empty(s, dtype=BF16, device="meta")
                    for s in ((m, 4096), (14336, 4096), (14336, 4096), (4096, 14336))]
            graph = make_fx(mlp)(*args).graph
            gemms, takers = idec.triton_takers(graph, "sm90", heuristics)
            assert (P(m) in takers) is templated is (P(m) in installed(graph, "sm90"))
            assert len(gemms) == (3 if templated else 0)
    finally:
        installation.disable()


def test_pass_leaves_an_up_projection_used_elsewhere():
    """The mm's product feeds another consumer too: fusing would compute it twice."""
    w = torch.randn(64, 32, dtype=BF16)

    def fn(x, g):
        up = x @ w.t()
        return F.silu(g) * up, up.sum()

    fusion = SwigluFusionPass(lambda p: PLAIN, "k", lambda device: "sm90")
    torch._dynamo.reset()
    prev = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = fusion
    try:
        torch.compile(fn)(torch.randn(16, 32, dtype=BF16), torch.randn(16, 64, dtype=BF16))
    finally:
        inductor_config.post_grad_custom_post_pass = prev
    assert not fusion.fused


def test_training_graphs_keep_the_up_product_that_backward_needs():
    """Under autograd the up projection's product is saved for the backward pass (silu(g)'s
    gradient needs it), so it has a user outside the pattern: nothing is fused and the
    gradients stay right."""
    g = torch.Generator().manual_seed(0)
    wg, wu = (torch.randn(64, 32, generator=g, dtype=BF16, requires_grad=True)
              for _ in range(2))
    x = torch.randn(16, 32, generator=g, dtype=BF16)

    def fn(x):
        return (F.silu(F.linear(x, wg)) * F.linear(x, wu)).float().sum()

    fusion = SwigluFusionPass(lambda p: PLAIN, "k", lambda device: "sm90")
    torch._dynamo.reset()
    prev = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = fusion
    try:
        torch.compile(fn)(x).backward()
    finally:
        inductor_config.post_grad_custom_post_pass = prev
    assert not fusion.fused
    got = wg.grad.clone(), wu.grad.clone()
    wg.grad = wu.grad = None
    fn(x).backward()
    for a, b in zip(got, (wg.grad, wu.grad)):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_user_pass_still_runs_and_keys_the_cache():
    seen = []

    class UserPass(CustomGraphPass):
        def __call__(self, graph):
            seen.append(len(graph.nodes))

        def uuid(self):
            return "user-v1"

    fusion = SwigluFusionPass(lambda p: PLAIN, "k1", lambda device: "sm90", UserPass())
    _compile(_mlp(BF16), torch.randn(16, 32, dtype=BF16), fusion)
    assert seen and fusion.fused
    assert "user-v1" in fusion.uuid() and "k1" in fusion.uuid()
    assert SwigluFusionPass(lambda p: None, "k2", lambda d: None).uuid() != fusion.uuid()


def test_enable_installs_the_pass_and_restores_the_users():
    class UserPass(CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return "user"

    user = UserPass()
    prev = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = user
    try:
        with iin.enable("predicted"):
            installed = inductor_config.post_grad_custom_post_pass
            assert _swiglu_pass().user_pass.user_pass is user  # after the GEMV pass
            with iin.enable("reduced", prefetch=False):  # nested: wraps the user's, not ours
                assert _swiglu_pass().user_pass.user_pass is user
            assert inductor_config.post_grad_custom_post_pass is installed
            with iin.enable("off"):
                assert inductor_config.post_grad_custom_post_pass is user
        assert inductor_config.post_grad_custom_post_pass is user
        with iin.enable("predicted", fuse_swiglu=False):
            assert _swiglu_pass() is None
            assert inductor_config.post_grad_custom_post_pass.user_pass.user_pass is user
    finally:
        inductor_config.post_grad_custom_post_pass = prev


def _swiglu_pass() -> SwigluFusionPass | None:
    """The SwiGLU fusion pass in the post-grad slot's chain of passes, if any."""
    p = inductor_config.post_grad_custom_post_pass
    while p is not None and not isinstance(p, SwigluFusionPass):
        p = getattr(p, "user_pass", None)
    return p


def test_pointwise_share_prices_the_saved_traffic_at_the_ceilings():
    """At K=4096 the pointwise kernel's 3*M*N elements cost 13 % of a compute-bound GEMM on
    an H200's ceilings; the share falls as 1/K."""
    assert idec.pointwise_share(P(4096)) == pytest.approx(0.1346, abs=1e-3)
    assert idec.pointwise_share(P(4096, k=8192)) == pytest.approx(0.1346 / 2, abs=1e-3)


def test_fusion_config_takes_the_first_config_without_split_k():
    assert idec.fusion_config(P(4096), Table(SPLIT, PLAIN)) == PLAIN
    assert idec.fusion_config(P(4096), Table(SPLIT)) is None
    assert idec.fusion_config(P(4096, k=16384), Table(PLAIN)) is None  # share under 8 %
    batched = GemmProblem(m=4096, n=14336, k=4096, batch=2, dtype="bf16", out_dtype="bf16",
                          a_major="k", b_major="k", arch="sm90")
    assert idec.fusion_config(batched, Table(PLAIN)) is None


def test_the_packaged_heuristics_fuse_the_llama_mlp_where_the_gpu_said_so():
    """The installed decision on Llama-3-8B's up projection: the fastest fused config
    measured at M 1 to 128, host-bound (data/inputs/swiglu/swiglu_small_h200.json), and at
    M 2048 to 8192 (data/inputs/swiglu/swiglu_h200.json); none at M=1024, where every fused
    config ran slower than the unfused default; the rule's pick at an unmeasured M."""
    measured = {}
    for name in ("swiglu_h200.json", "swiglu_small_h200.json"):
        bench = json.loads((DATA / "inputs" / "swiglu" / name).read_text())
        measured.update(hz.measured_fusions(bench, "sm90", "bf16"))
    installation = iin.enable("predicted")
    try:
        decide = _swiglu_pass().decide
        for m in (1, 16, 128, 2048, 4096, 8192):
            assert decide(P(m)) == measured[P(m).key()] is not None
        assert measured[P(1024).key()] is None and decide(P(1024)) is None
        configs, _ = PackagedHeuristics().lookup(P(3000))  # unmeasured: the rule
        assert decide(P(3000)) == next(c for c in configs if c.split_k == 1)
    finally:
        installation.disable()


def _bench(unfused, fused, ran_quack=True):
    rows = [{"variant": "cublas+pointwise", "status": "ok", "time_ms": unfused}]
    rows += [{"variant": "fused", "status": status, "time_ms": t, "config": c.to_dict(),
              "ran_quack": ran_quack} for c, t, status in fused]
    return {"shapes": [{"problem": P(4096).to_dict(), "rows": rows}]}


def test_measured_fusions_take_the_fastest_fused_config_that_beats_the_default():
    key = P(4096).key()
    got = hz.measured_fusions(_bench(1.0, [(PLAIN, 0.9, "ok"), (SPLIT, 0.8, "wrong_result"),
                                               (KernelConfig(), 0.95, "ok")]), "sm90", "bf16")
    assert got == {key: PLAIN}
    assert hz.measured_fusions(_bench(1.0, [(PLAIN, 1.1, "ok")]), "sm90", "bf16") == {key: None}
    # the ATen fallback's timing is not the fused kernel's
    assert hz.measured_fusions(_bench(1.0, [(PLAIN, 0.5, "ok")], ran_quack=False),
                                   "sm90", "bf16") == {key: None}
    assert hz.measured_fusions(_bench(1.0, [(PLAIN, 0.5, "ok")]), "sm100", "bf16") == {}


def test_heuristics_file_carries_the_measured_fusions(tmp_path):
    """Round trip through the file; a measured problem's answer (a config, or None) wins over
    the rule; a corrupt entry is named."""
    from cutetune.models import heuristics as hz

    class Model:
        def rank(self, problem, configs=None, top_k=None):
            return [(SPLIT, 1.0), (PLAIN, 2.0)][:top_k]

        def prefers_cublas(self, problem, configs=None):
            return True

    grid = hz.Grid(m=(1, 4096), n=(64, 16384), k=(64, 4096))
    table = {P(4096).key(): KernelConfig(tile_m=64, tile_n=256), P(8192).key(): None}
    path = hz.build(Model(), "sm90", "bf16", grid=grid, swiglu=table).save(tmp_path / "h.json")
    h = hz.Heuristics.load(path)
    assert h.swiglu_config(P(4096)) == (True, KernelConfig(tile_m=64, tile_n=256))
    assert h.swiglu_config(P(8192)) == (True, None) and h.swiglu_config(P(2048)) == (False, None)
    assert idec.fusion_config(P(4096), h) == KernelConfig(tile_m=64, tile_n=256)
    assert idec.fusion_config(P(8192), h) is None
    assert idec.fusion_config(P(2048), h) == PLAIN  # the rule: first config without split-K
    d = json.loads(path.read_text())
    d["swiglu"][P(4096).key()] = 10**6
    path.write_bytes(sealed_json(d))  # sealed: the content is checked too
    with pytest.raises(hz.HeuristicsError, match="bad SwiGLU entry"):
        hz.Heuristics.load(path)


def test_cpu_tensors_run_aten():
    a, b, gate = torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 4)
    out = torch.empty(8, 4)
    assert "not an sm90 or sm100 GPU" in swiglu.unsupported_reason(a, b, gate, out, PLAIN)
    swiglu.quack_mm_silu_mul_out(a, b, gate, out, PLAIN)
    torch.testing.assert_close(out, F.silu(gate) * (a @ b))
    assert swiglu.launched_via(a, b, gate, out, PLAIN) is None


def test_the_unfused_product_runs_eager_where_its_kernel_does_not_take_the_operands():
    """silu(gate) * up in place: the Triton kernel takes contiguous CUDA operands of one
    shape and dtype; anything else (CPU tensors here, a transposed gate) runs eager ATen."""
    gate, up = torch.randn(8, 6), torch.randn(8, 6)
    want = F.silu(gate) * up
    assert not pointwise.one_pass(up, gate)
    assert pointwise.silu_mul_(up, gate) is up
    torch.testing.assert_close(up, want)
    up2 = torch.randn(6, 8)
    want = F.silu(gate.t()) * up2
    pointwise.silu_mul_(up2, gate.t())
    torch.testing.assert_close(up2, want)


def test_the_one_pass_kernels_variants_are_what_triton_specializes_on():
    """A CUDA-graph capture runs the one-pass product only in a variant Triton compiled
    before: dtype, 16-byte aligned pointers, and n divisible by 16 or equal to 1 each make
    one."""
    a, b = torch.empty(64, dtype=BF16), torch.empty(64, dtype=BF16)
    v = pointwise._variant(a, b, 64)
    assert v == pointwise._variant(a.clone(), b.clone(), 32)
    assert v != pointwise._variant(a.half(), b.half(), 64)
    assert v != pointwise._variant(a, b, 63) != pointwise._variant(a, b, 1)
    assert v != pointwise._variant(a[1:], b, 63)  # a pointer 2 bytes past an aligned one


def test_a_failing_library_leaves_the_call_on_quack_and_a_failing_quack_on_aten(monkeypatch):
    """The first launch tries the kernel's library, then quack's plan; what raises is logged
    and the next path runs, ATen last, and later calls keep to the path that ran."""
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(swiglu, "_plans", {})
    calls = []

    def runner(name, fail):
        def run(a, b, gate, out):
            calls.append(name)
            if fail:
                raise RuntimeError(f"{name} broke")
            out.copy_(F.silu(gate) * (a @ b))
        return run

    a, b = torch.randn(256, 512, dtype=BF16), torch.randn(512, 1024, dtype=BF16)
    gate, out = torch.randn(256, 1024, dtype=BF16), torch.empty(256, 1024, dtype=BF16)
    for quack_fails, via in ((False, "quack"), (True, None)):
        swiglu._plans.clear()
        monkeypatch.setattr(swiglu, "_library_runner",
                            lambda *args: runner("library", True))
        monkeypatch.setattr(swiglu, "_quack_runner",
                            lambda *args, f=quack_fails: runner("quack", f))
        calls.clear()
        for _ in range(2):
            swiglu.quack_mm_silu_mul_out(a, b, gate, out, PLAIN)
            torch.testing.assert_close(out, F.silu(gate) * (a @ b))
        assert swiglu.launched_via(a, b, gate, out, PLAIN) == via
        assert calls == (["library", "quack", "quack"] if via else ["library", "quack"])


def test_calls_run_aten_while_the_helper_builds_the_library(monkeypatch, caplog):
    """While the compile helper's build of a call's library is pending, calls run ATen
    (unfused) without waiting, and the first says so; the first call after the build is done
    launches the library and later ones keep it; where the build failed, quack runs it."""
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(swiglu, "_plans", {})
    monkeypatch.setattr(swiglu, "_builds", {})
    calls, state = [], {}

    def runner(name):
        def run(a, b, gate, out):
            calls.append(name)
            out.copy_(F.silu(gate) * (a @ b))
        return run

    monkeypatch.setattr(swiglu, "_library_runner", lambda config, key, device: (
        runner("library") if state[key] == "done" else None))
    monkeypatch.setattr(swiglu, "_quack_runner", lambda *args: runner("quack"))
    a, b = torch.randn(256, 512, dtype=BF16), torch.randn(512, 1024, dtype=BF16)
    gate, out = torch.randn(256, 1024, dtype=BF16), torch.empty(256, 1024, dtype=BF16)
    p = problems.fused_call_problem(a, b, gate, out, PLAIN)
    key = swiglu.library_key(PLAIN, "sm90", BF16, (p.a_major, p.b_major))
    swiglu.building(key, lambda: state[key])
    for final, via in (("done", "library"), ("failed: no compiler", "quack")):
        swiglu._plans.clear()
        calls.clear()
        state[key] = "pending"
        with caplog.at_level("INFO", logger="cutetune.tuner.kernels"):
            caplog.clear()
            for _ in range(3):
                swiglu.quack_mm_silu_mul_out(a, b, gate, out, PLAIN)
                torch.testing.assert_close(out, F.silu(gate) * (a @ b))
        assert calls == [] and swiglu.launched_via(a, b, gate, out, PLAIN) is None
        assert caplog.text.count("runs ATen until the compile helper has built") == 1
        state[key] = final
        for _ in range(2):
            swiglu.quack_mm_silu_mul_out(a, b, gate, out, PLAIN)
            torch.testing.assert_close(out, F.silu(gate) * (a @ b))
        assert calls == [via] * 2 and swiglu.launched_via(a, b, gate, out, PLAIN) == via


def test_unsupported_reasons_name_the_problem(monkeypatch):
    monkeypatch.setattr(problems, "device_arch", lambda device: "sm90")
    a, b = torch.randn(256, 512, dtype=BF16), torch.randn(512, 1024, dtype=BF16)
    gate, out = torch.randn(256, 1024, dtype=BF16), torch.empty(256, 1024, dtype=BF16)
    assert swiglu.unsupported_reason(a, b, gate, out, PLAIN) is None
    assert "split-K" in swiglu.unsupported_reason(a, b, gate, out, SPLIT)
    assert "gate is (256, 512)" in swiglu.unsupported_reason(a, b, gate[:, :512], out, PLAIN)
    assert "gate is" in swiglu.unsupported_reason(a, b, gate.float(), out, PLAIN)
    assert "2D operands" in swiglu.unsupported_reason(a[None], b[None], gate, out, PLAIN)


def test_custom_op_config_round_trips():
    for config in (PLAIN, SPLIT, KernelConfig(swap_ab=True, is_dynamic_persistent=True)):
        ints = problems.config_ints(config)
        assert all(type(v) is int for v in ints)
        a, b, gate = torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 4)
        torch.testing.assert_close(torch.ops.cutetune.mm_silu_mul(a, b, gate, ints),
                                   F.silu(gate) * (a @ b))


BUILD_GPU_BLIND = """
import json, sys
from cutetune.tuner.kernels.compile import configure_gpu_blind
configure_gpu_blind("sm90", sys.argv[1])
import torch
from cutetune.space.config import KernelConfig
from cutetune.tuner.kernels import swiglu
out = []
for fields, majors in json.loads(sys.argv[2]):
    try:
        out.append(["ok", swiglu.build_library(KernelConfig(**fields), "sm90", torch.bfloat16,
                                               tuple(majors))])
    except Exception as e:
        out.append(["error", f"{type(e).__name__}: {e}"])
print(json.dumps(out))
"""

BUILD_TWICE = """
import json, os, sys
from cutetune.tuner.kernels.compile import configure_gpu_blind
configure_gpu_blind("sm90", sys.argv[1])
import torch
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GemmProblem
from cutetune.tuner.kernels import aot, library as gemm_library, swiglu
config, problem = KernelConfig(tile_m=128, tile_n=128, pingpong=False), GemmProblem(256, 512, 1024)
out = []
for folder in sys.argv[2:]:
    os.environ["CUTETUNE_CACHE"] = folder
    swiglu.build_library(config, "sm90", torch.bfloat16, ("k", "k"))
    gemm_library.build_library(problem, config)
    out.append([aot.library_ready(swiglu.library_key(config, "sm90", torch.bfloat16, ("k", "k"))),
                aot.library_ready(gemm_library.library_key(problem, config))])
print(json.dumps(out))
"""

LOAD_WITHOUT_CUTLASS = """
import json, sys, torch, tvm_ffi
from cutetune.tuner.kernels import aot
meta = json.loads(aot.library_paths(sys.argv[1])[1].read_text())
fn = tvm_ffi.load_module(str(aot.library_paths(sys.argv[1])[0]))[meta["function"]]
a = torch.empty(256, 128, dtype=torch.bfloat16)
try:
    fn(a, a.t(), a, a, *meta["tail"])
    err = None
except ValueError as e:
    err = str(e)
print(json.dumps({"err": err, "tail": meta["tail"],
                  "imported": [m for m in ("cutlass", "quack") if m in sys.modules]}))
"""


@pytest.mark.compile
def test_a_kernel_quack_holds_in_memory_is_built_again(tmp_path, run_script):
    """A library build in a process whose quack has the kernel in memory (a helper forked from
    a process that ran it) compiles it again, so it gets the object file it links: fused and
    plain kernels."""
    assert run_script(BUILD_TWICE, tmp_path / "quack", tmp_path / "a", tmp_path / "b") == [
        [True, True], [True, True]]


@pytest.mark.compile
def test_fused_kernel_builds_gpu_blind_into_a_library_that_loads_without_cutlass(
        tmp_path, monkeypatch, run_script):
    """The fused epilogue compiles on a CPU for sm90 (pingpong with a 2x1 cluster; a swap_ab
    config with an "m"-major A, as a transposed activation gives) and is linked into a TVM-FFI
    library; a config quack rejects fails with its reason instead of crashing the process. A
    fresh process loads each library with tvm_ffi alone (no cutlass, no quack) and reaches the
    kernel's own argument checks: a CPU tensor is refused for want of a GPU. Written as a
    package of object files, they link into another cache folder and load the same way."""
    from cutetune.tuner.kernels import aot

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cutetune"))
    jobs = [(KernelConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2), ("k", "k")),
            (KernelConfig(tile_m=128, tile_n=128, pingpong=True, cluster_m=1, cluster_n=2,
                          swap_ab=True), ("m", "n")),
            (KernelConfig(tile_m=256, tile_n=128, pingpong=True), ("k", "k"))]  # M <= 192
    results = run_script(BUILD_GPU_BLIND, tmp_path / "quack",
                         json.dumps([(c.to_dict(), m) for c, m in jobs]))
    assert [r[0] for r in results] == ["ok", "ok", "error"], results
    assert "CTA tile shape M" in results[2][1]
    keys = [swiglu.library_key(c, "sm90", BF16, m) for c, m in jobs]
    assert [aot.library_ready(k) for k in keys] == [True, True, False]
    # shipped as object files: another cache folder links them from the package
    package = tmp_path / "kernels.zip"
    aot.write_package(package, [swiglu.library_spec(jobs[0][0], "sm90", BF16, jobs[0][1])])
    aot.write_package(package, [swiglu.library_spec(c, "sm90", BF16, m) for c, m in jobs[:2]])
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "fresh"))
    assert not aot.library_ready(keys[0]) and not aot.ensure_library(keys[2], package)
    assert all(aot.ensure_library(k, package) for k in keys[:2])
    for key in keys[:2]:
        got = run_script(LOAD_WITHOUT_CUTLASS, key)
        assert got["imported"] == []
        assert "expected device_type=cuda" in got["err"] and "__call__(mA: Tensor" in got["err"]
        assert aot.CLUSTERS_SENTINEL in got["tail"][1]  # filled from the device at run time


def test_shipped_kernels_match_the_table_and_install_only_where_built(tmp_path, monkeypatch):
    """The shipped object files (``cutetune prebuild --package``) are the shipped table's fused
    kernels for each environment that built them, keyed by it (recomputed from the manifest);
    an environment that built them links each, any other none."""
    import zipfile

    from cutetune.tuner.kernels import aot
    from cutetune.models.heuristics import Heuristics, default_path
    from cutetune.tuner.kernels.prebuild import fused_kernels

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path))
    with zipfile.ZipFile(aot.PACKAGE) as z:
        manifest = json.loads(z.read("manifest.json"))
        names = set(z.namelist())
    envs, kernels = manifest["environments"], manifest["kernels"]
    assert envs and all(aot.kernel_key(k["spec"], envs[k["environment"]]) == key
                        for key, k in kernels.items())
    assert names == {"manifest.json"} | {f"{k}.{x}" for k in kernels for x in ("o", "json")}
    h = Heuristics.load(default_path("sm90", "bf16"))
    table = sorted(sorted(c.to_dict().items()) for _, c in fused_kernels(h).values())
    for i in range(len(envs)):
        assert sorted(sorted(k["spec"]["config"].items()) for k in kernels.values()
                      if k["environment"] == i) == table
    here = [swiglu.library_key(c, p.arch, BF16, (p.a_major, p.b_major))
            for p, c in fused_kernels(h).values()]
    if aot.build_environment() not in envs:
        assert not any(aot.ensure_library(k) for k in here)
    elif aot.can_link():
        assert all(aot.ensure_library(k) for k in here)


def test_a_corrupt_package_is_reported_and_costs_nothing(tmp_path, monkeypatch, caplog):
    from cutetune.tuner.kernels import aot

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "kernels.zip"
    bad.write_bytes(b"not a zip")
    with caplog.at_level("WARNING"):
        assert not aot.ensure_library("0" * 32, bad)
    assert "are unreadable" in caplog.text and str(bad) in caplog.text
    assert not aot.ensure_library("0" * 32, tmp_path / "absent.zip")


def test_the_prebuilt_kernels_can_be_named_or_turned_off(tmp_path, monkeypatch, caplog):
    """CUTETUNE_FUSED_KERNELS names the zip first uses link from (a deployment's own
    `cutetune prebuild --package`); empty turns the shipped one off; a name that is not a
    file is reported and costs nothing."""
    from cutetune.tuner.kernels import aot

    monkeypatch.delenv("CUTETUNE_FUSED_KERNELS", raising=False)
    assert aot.packaged_kernels() == aot.PACKAGE
    monkeypatch.setenv("CUTETUNE_FUSED_KERNELS", "")
    assert aot.packaged_kernels() is None
    own = tmp_path / "own.zip"
    own.write_bytes(b"")
    monkeypatch.setenv("CUTETUNE_FUSED_KERNELS", str(own))
    assert aot.packaged_kernels() == own
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTETUNE_FUSED_KERNELS", str(tmp_path / "absent.zip"))
    with caplog.at_level("WARNING"):
        assert not aot.ensure_library("0" * 32)
    assert "CUTETUNE_FUSED_KERNELS" in caplog.text and "absent.zip" in caplog.text


def test_a_corrupt_library_is_reported_and_the_call_goes_through_quack(tmp_path, monkeypatch,
                                                                      caplog):
    """A library whose shared object does not load (here: not an ELF file) or whose launch
    arguments are not JSON raises AotError naming its file, and the first launch leaves it
    for quack's path with a warning, and removes it to be built again."""
    from cutetune.tuner.kernels import aot

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path))
    so, meta = aot.library_paths("k1")
    so.parent.mkdir(parents=True)
    so.write_bytes(b"not a shared object")
    meta.write_text(json.dumps({"format": aot.FORMAT, "function": "f", "b_kn": True,
                                "swapped": False, "tail": []}))
    with pytest.raises(aot.AotError, match="k1.json: RuntimeError: .*k1.so"):
        aot.Library("k1", torch.device("cpu"), 1)
    meta.write_text("{")
    with pytest.raises(aot.AotError, match="k1.json"):
        aot.Library("k1", torch.device("cpu"), 1)
    with caplog.at_level("WARNING"):
        assert swiglu._library_runner(PLAIN, "k1", torch.device("cpu")) is None
    assert "the fused kernel's library did not load" in caplog.text and "using quack" in caplog.text
    assert not meta.exists()  # the next build makes it again


# ---------------------------------------------------------------- GPU
gpu = pytest.mark.gpu
GPU_CONFIGS = (PLAIN, KernelConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2),
               KernelConfig(tile_m=64, tile_n=128, pingpong=False, cluster_m=1, cluster_n=1),
               KernelConfig(tile_m=128, tile_n=128, pingpong=False, swap_ab=True))


def _gpu_operands(dtype):
    torch.manual_seed(0)
    a = torch.randn(1000, 2048, device="cuda", dtype=dtype)
    w = torch.randn(4096, 2048, device="cuda", dtype=dtype)
    gate = torch.randn(1000, 4096, device="cuda", dtype=dtype)
    out = torch.full((1000, 4096), float("nan"), device="cuda", dtype=dtype)
    return a, w.t(), gate, out


def _rel_err_to_fp32(a, b, gate, out) -> float:
    ref = F.silu(gate.float()) * (a.float() @ b.float())
    return ((out.float() - ref).norm() / ref.norm()).item()


@gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1024, 14336), (3, 1000), (1, 7)])
def test_gpu_unfused_product_is_one_kernel_rounded_once(shape, dtype):
    """The Triton kernel computes silu(gate) * up in fp32 and rounds once, as Inductor's
    pointwise kernel does (within one ulp of it), in place, on sizes that do not fill its
    blocks too."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    gate = torch.randn(shape, device="cuda", dtype=dtype)
    up = torch.randn(shape, device="cuda", dtype=dtype)
    want = (F.silu(gate.float()) * up.float()).to(dtype).float()
    assert pointwise.one_pass(up, gate)
    pointwise.silu_mul_(up.clone(), gate)  # compiles
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        assert pointwise.silu_mul_(up, gate) is up
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert kernels == ["silu_mul_inplace"], kernels
    ulp = want.abs() * torch.finfo(dtype).eps + torch.finfo(dtype).tiny
    assert ((up.float() - want).abs() <= ulp).all()


@gpu
def test_gpu_unfused_product_runs_eager_in_a_capture_until_its_kernel_is_compiled(
        monkeypatch):
    """A CUDA-graph capture must not compile: before the kernel's first launch in the process
    a captured call runs eager ATen, and the replay computes the same product."""
    monkeypatch.setattr(pointwise, "_launched", set())
    gate = torch.randn(64, 256, device="cuda", dtype=BF16)
    up = torch.randn(64, 256, device="cuda", dtype=BF16)
    want = F.silu(gate) * up
    graph = torch.cuda.CUDAGraph()
    start = up.clone()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        pointwise.silu_mul_(up, gate)
    assert not pointwise._launched
    up.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(up, want)


@gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.short())
def test_gpu_fused_kernel_matches_fp32(config, dtype, tmp_path, monkeypatch):
    """quack's fused kernel (not the ATen fallback; no library built, so through quack) for
    several configs, swap_ab among them, in both 16-bit dtypes, on nn.Linear's transposed
    weight, against silu(G) * (A @ B) in fp32."""
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(swiglu, "_plans", {})
    a, b, gate, out = _gpu_operands(dtype)
    assert swiglu.unsupported_reason(a, b, gate, out, config) is None
    swiglu.quack_mm_silu_mul_out(a, b, gate, out, config)
    assert swiglu.launched_via(a, b, gate, out, config) == "quack"
    assert _rel_err_to_fp32(a, b, gate, out) < 1e-2


@gpu
def test_gpu_fused_kernel_runs_from_its_library_without_quack(tmp_path, monkeypatch,
                                                             run_script):
    """Libraries built GPU-blind in another process (as the compile helper builds them) run
    the fused kernel right for a 2x1 cluster, a swap_ab config and an "m"-major A, with no
    import of quack or cutlass in the process that launches them (checked in a fresh one); the
    cluster count asked of the driver is what quack's own query (cutlass) answers."""
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cutetune"))
    jobs = [(GPU_CONFIGS[1], ("k", "k")), (GPU_CONFIGS[3], ("k", "k")), (PLAIN, ("m", "k"))]
    built = run_script(BUILD_GPU_BLIND, tmp_path / "quack",
                       json.dumps([(c.to_dict(), m) for c, m in jobs]))
    assert [r[0] for r in built] == ["ok"] * 3
    got = run_script(LAUNCH_FROM_LIBRARIES, json.dumps([c.to_dict() for c, _ in jobs]))
    assert got["imported"] == [] and got["via"] == ["library"] * 3, got
    assert max(got["errors"]) < 1e-2, got
    from quack.cute_dsl_utils import get_max_active_clusters

    from cutetune.tuner.kernels import aot

    for size in (1, 2, 4):
        assert aot.max_active_clusters(torch.device("cuda"), size) == \
            get_max_active_clusters(size)


LAUNCH_FROM_LIBRARIES = """
import json, sys, torch, torch.nn.functional as F
from cutetune.space.config import KernelConfig
from cutetune.tuner.kernels import swiglu
out = {"via": [], "errors": []}
torch.manual_seed(0)
for i, fields in enumerate(json.loads(sys.argv[1])):
    config = KernelConfig(**fields)
    a = torch.randn(1000, 2048, device="cuda", dtype=torch.bfloat16)
    if i == 2:  # an "m"-major A
        a = torch.randn(2048, 1000, device="cuda", dtype=torch.bfloat16).t()
    b = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16).t()
    gate = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    d = torch.full((1000, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    swiglu.quack_mm_silu_mul_out(a, b, gate, d, config)
    out["via"].append(swiglu.launched_via(a, b, gate, d, config))
    ref = F.silu(gate.float()) * (a.float() @ b.float())
    out["errors"].append(((d.float() - ref).norm() / ref.norm()).item())
out["imported"] = [m for m in ("cutlass", "quack") if m in sys.modules]
print(json.dumps(out))
"""


@pytest.fixture
def cold_llama_mlp(monkeypatch, tmp_path):
    """Llama-3-8B's MLP and an M=2048 input on the GPU, with an empty kernel cache, no
    prebuilt kernels and a compile helper of its own (closed afterwards)."""
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path))
    monkeypatch.setenv("CUTETUNE_FUSED_KERNELS", "")
    monkeypatch.setattr(prefetch, "SHARED_PREFETCHERS", {})  # a helper seeing this cache folder
    monkeypatch.setattr(swiglu, "_plans", {})
    monkeypatch.setattr(swiglu, "_builds", {})
    torch.manual_seed(0)
    lin = lambda i, o: torch.nn.Linear(i, o, bias=False).cuda().to(BF16)  # noqa: E731
    gate, up, down = lin(4096, 14336), lin(4096, 14336), lin(14336, 4096)
    yield (lambda x: down(F.silu(gate(x)) * up(x)),
           torch.randn(2048, 4096, device="cuda", dtype=BF16))
    for helper in prefetch.SHARED_PREFETCHERS.values():
        helper.close()


@gpu
def test_gpu_predicted_mode_fuses_the_llama_mlp_at_m_2048(cold_llama_mlp):
    """The packaged heuristics' decision at Llama-3-8B's shapes: predicted mode compiles the
    MLP at M=2048 with the fused up projection and runs it right. With an empty kernel cache
    (and no prebuilt kernels) the first call runs ATen while the compile helper builds the
    kernel's library, and the first call after that launches it; the next compile launches
    it at once."""
    from torch._inductor.utils import fresh_cache

    from cutetune.tuner.kernels import aot

    mlp, x = cold_llama_mlp
    def err(out, ref):
        return ((out.float() - ref.float()).norm() / ref.float().norm()).item()

    vias = []
    for _ in range(2):
        torch._dynamo.reset()
        swiglu._plans.clear()
        with torch.no_grad(), fresh_cache(), iin.enable("predicted"):
            compiled = torch.compile(mlp)
            out, code = run_and_get_code(compiled, x)
            ref = mlp(x)
            assert f"extern_kernels.{swiglu.MM_SILU_MUL_KERNEL}(" in "".join(code)
            assert err(out, ref) < 2e-2
            first = {p.via for p in swiglu._plans.values()}
            if aot.can_link():
                iin.shared_prefetcher("sm90").wait(timeout=300)
                assert iin.shared_prefetcher("sm90").failures() == {}
            assert err(compiled(x), ref) < 2e-2
            vias.append((first, {p.via for p in swiglu._plans.values()}))
    if aot.can_link():  # the helper may win the race with the first call, rarely
        assert vias[0] in (({None}, {"library"}), ({"library"}, {"library"}))
        assert vias[1] == ({"library"}, {"library"})
    else:
        assert vias == [({"quack"}, {"quack"})] * 2


@gpu
def test_gpu_predicted_mode_fuses_a_dynamic_m_per_range(cold_llama_mlp):
    """Llama-3-8B's MLP compiled once with its M dynamic: the packaged heuristics' decision
    per range of M (unfused at M=1024, where the GPU measured the fusion slower; fused with a
    range's config elsewhere, host-bound M=100 too), every M right in the one graph, the
    fused kernels launched from the libraries the compile helper built."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    from cutetune.tuner.kernels import aot

    mlp, x = cold_llama_mlp
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), fresh_cache(), iin.enable("predicted"):
        compiled = torch.compile(mlp)
        code = "".join(run_and_get_code(compiled, x)[1])
        if aot.can_link():
            iin.shared_prefetcher("sm90").wait(timeout=300)
            assert iin.shared_prefetcher("sm90").failures() == {}
        for m in (100, 512, 1024, 2048, 3000):
            xm = torch.randn(m, 4096, device="cuda", dtype=BF16)
            out, ref = compiled(xm), mlp(xm)
            assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-2
    assert counters["stats"]["unique_graphs"] == 1
    assert code.count(f"extern_kernels.{swiglu.MM_SILU_MUL_BY_M_KERNEL}(") == 1
    vias = {k[1][0]: p.via for k, p in swiglu._plans.items()}
    assert set(vias) == {100, 512, 2048, 3000}  # M=1024 ran unfused, on ATen
    assert set(vias.values()) == {"library" if aot.can_link() else "quack"}


@gpu
def test_gpu_fused_mlp_replays_under_cuda_graphs(cold_llama_mlp):
    """mode="reduce-overhead": the compiled MLP records its CUDA graph with the fused calls on
    ATen while the compile helper builds the kernel (a capture loads no library), and, once
    the library is built, a new compile records the library's launch; both replay right."""
    from torch._inductor.utils import fresh_cache

    from cutetune.tuner.kernels import aot

    if not aot.can_link():
        pytest.skip("no C compiler to link the kernel's library")
    mlp, x = cold_llama_mlp
    with torch.no_grad():
        ref = mlp(x).float()
    vias = []
    for _ in range(2):
        torch._dynamo.reset()
        swiglu._plans.clear()
        with torch.no_grad(), fresh_cache(), iin.enable("predicted"):
            compiled = torch.compile(mlp, mode="reduce-overhead")
            code = run_and_get_code(compiled, x)[1]
            assert f"extern_kernels.{swiglu.MM_SILU_MUL_KERNEL}(" in "".join(code)
            for _ in range(4):  # warm-up, record, replays
                out = compiled(x).float()
                assert ((out - ref).norm() / ref.norm()).item() < 2e-2
            vias.append({p.via for p in swiglu._plans.values()})
            iin.shared_prefetcher("sm90").wait(timeout=300)
            assert iin.shared_prefetcher("sm90").failures() == {}
    assert vias[0] <= {None, "library"} and vias[1] == {"library"}


FRESH_PROCESS = """
import json, torch, torch.nn.functional as F
from torch._dynamo.utils import counters
from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
from cutetune.tuner.kernels import problems
from cutetune.models import triton_mm as tmm
torch.manual_seed(0)
lin = lambda i, o: torch.nn.Linear(i, o, bias=False).cuda().to(torch.bfloat16)
gate, up, down = lin(4096, 14336), lin(4096, 14336), lin(14336, 4096)
mlp = lambda x: down(F.silu(gate(x)) * up(x))
x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
with torch.no_grad(), iin.enable("predicted"):
    out = torch.compile(mlp)(x)
    ref = mlp(x)
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"]
                  + counters["aot_autograd"]["autograd_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "err": ((out.float() - ref.float()).norm() / ref.float().norm()).item()}))
"""


@gpu
def test_gpu_fused_mlp_reloads_from_the_fx_graph_cache_in_a_fresh_process(tmp_path,
                                                                            run_script):
    """Generated code that calls the fused kernel runs after a reload from Inductor's
    FX-graph cache in a fresh process (enable() installs the fusion pass, which registers the
    kernel by name before the code runs)."""
    _reload_from_the_fx_graph_cache(run_script, FRESH_PROCESS, tmp_path,
                                    swiglu.MM_SILU_MUL_KERNEL, 2e-2)


def test_prebuild_lists_the_shipped_tables_fused_kernels_once_each():
    """``cutetune prebuild`` builds one library per distinct fused kernel of the shipped
    SwiGLU table (its keys parse back into the table's problems; none splits K)."""
    from cutetune.models.heuristics import Heuristics, default_path
    from cutetune.tuner.kernels.prebuild import fused_kernels

    h = Heuristics.load(default_path("sm90", "bf16"))
    kernels = fused_kernels(h)
    fused = {k: i for k, i in h.swiglu.items() if i is not None}
    assert kernels and len(kernels) <= len(fused)
    assert {p.key() for p, _ in kernels.values()} <= set(fused)
    assert {c for _, c in kernels.values()} == {h.configs[i] for i in fused.values()}
    assert all(c.split_k == 1 for _, c in kernels.values())


def test_a_missing_compiler_is_reported_and_costs_nothing(tmp_path, monkeypatch, caplog):
    """A package whose object file cannot be linked (here: $CC names no program) leaves the
    kernel unbuilt with a warning naming the command, and nothing half-written."""
    import zipfile

    from cutetune.tuner.kernels import aot

    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    package, key = tmp_path / "kernels.zip", "f" * 32
    with zipfile.ZipFile(package, "w") as z:
        z.writestr(f"{key}.o", b"an object file")
        z.writestr(f"{key}.json", b"{}")
    monkeypatch.setattr(aot, "runtime_libraries", lambda: ("/lib/a.so", "/lib/b.so"))
    with caplog.at_level("WARNING"):
        assert not aot.ensure_library(key, package)
    assert "linking failed" in caplog.text and "no-such-cc" in caplog.text
    assert not aot.library_ready(key) and not aot.library_paths(key)[0].exists()
