"""``cutetune.grouped_mm`` and the grouped GEMM pass, up to the GPU: the one conversion from
operands to a GroupedProblem, the model's picks by rung, the op's ATen path and autograd, and
the compiled graphs' tables (the kernels themselves: test_grouped_mm_gpu.py)."""

import logging
import textwrap
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code
from torch._inductor.virtualized import V

import cutetune
from cutetune.models.artifact import load_model
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GroupedProblem, ProblemError
from cutetune.tuner.inductor import install as iin
from cutetune.tuner.inductor.passes import GemvPass, GroupedMmPass, SwigluFusionPass
from cutetune.tuner.kernels import grouped_mm as gmm
from cutetune.tuner.kernels import problems
from cutetune.tuner.kernels.launcher import M_UNBOUNDED

BF16 = torch.bfloat16
CONFIG = KernelConfig(tile_m=128, tile_n=128)


def operands(e=4, m=64, k=32, n=48, counts=(16, 16, 8, 24)):
    a = torch.randn(m, k, dtype=BF16, requires_grad=True)
    w = torch.randn(e, n, k, dtype=BF16, requires_grad=True)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    return a, w, offs


def grouped(a, b, groups, dtype=BF16, arch="sm90"):
    return problems.grouped_problem(a.shape, a.stride(), b.shape, b.stride(), groups, dtype,
                                    dtype, arch)


# ---------------------------------------------------------------- operands -> problem
def test_the_three_moe_forms_are_the_three_grouped_gemms():
    x, w = torch.empty(640, 7168), torch.empty(8, 4096, 7168)
    fwd = grouped(x, w.mT, 8)
    assert fwd == GroupedProblem(8, 640, 4096, 7168, gemm="fwd")
    dy = torch.empty(640, 4096)
    assert grouped(dy, w, 8) == GroupedProblem(8, 640, 7168, 4096, gemm="dgrad")
    assert grouped(dy.mT, x, 8) == GroupedProblem(8, 4096, 7168, 640, gemm="wgrad")


@pytest.mark.parametrize("a, b, why", [
    (torch.empty(64, 32).mT.contiguous().mT, torch.empty(4, 48, 32).mT, "row-major"),
    (torch.empty(64, 32), torch.empty(3, 48, 32).mT, "do not multiply"),
    (torch.empty(4, 64, 32), torch.empty(4, 32, 48), "2D x 3D"),
    (torch.empty(64, 32), torch.empty(32, 48), "M-major"),
    (torch.empty(64, 30), torch.empty(4, 48, 30).mT, "aligned"),
])
def test_forms_quack_cannot_run_are_named(a, b, why):
    with pytest.raises(ProblemError, match=why):
        grouped(a, b, 4)


def test_dtypes_and_devices_are_checked():
    with pytest.raises(ProblemError, match="dtype"):
        grouped(torch.empty(64, 32), torch.empty(4, 48, 32).mT, 4, dtype=torch.float32)
    with pytest.raises(ProblemError, match="sm90 or sm100"):
        grouped(torch.empty(64, 32), torch.empty(4, 48, 32).mT, 4, arch=None)
    a, w, offs = operands()
    with pytest.raises(ProblemError, match="int32"):
        problems.grouped_call_problem(a, w.mT, offs.long())
    with pytest.raises(ProblemError, match="one dtype"):
        problems.grouped_call_problem(a, w.mT.half(), offs)


# ---------------------------------------------------------------- the model's picks
class Stub:
    """A grouped model that picks CONFIG, and prefers ATen for varlen K."""

    def __init__(self):
        self.asked = []

    def rank(self, problem, top_k=None):
        return [(CONFIG, 1.0)]

    def picks(self, problems):
        self.asked.extend(problems)
        return [None if p.ragged == "k" else CONFIG for p in problems]


def test_picker_asks_once_per_problem_and_respects_the_fallback():
    stub = Stub()
    picker = gmm.Picker(stub)
    p = GroupedProblem(8, 1024, 4096, 7168)
    assert picker.pick(p) == CONFIG and picker.pick(p) == CONFIG
    assert stub.asked == [p]
    assert picker.pick(GroupedProblem(8, 4096, 7168, 1024, gemm="wgrad")) is None


def test_the_shipped_model_picks_for_the_moe_shapes():
    """Its picks, made for many problems at once, are each problem's top-1 or, where the
    fallback prefers it, ATen: both answers occur."""
    picker = gmm.Picker()
    model = load_model(None, "sm90", "bf16", "grouped")
    from cutetune.space.suites import expert_gemm

    problems = [expert_gemm(gemm, e, tokens * 8, n, k)
                for e, n, k in ((256, 4096, 7168), (128, 1536, 2048))
                for tokens in (16, 1024, 8192, 32768) for gemm in ("fwd", "wgrad")]
    picker.pick_all(problems)
    answers = []
    for p in problems:
        (top1, ms), = model.rank(p, top_k=1)
        answers.append(None if model.prefers_aten(p, top1_ms=ms) else top1)
        assert picker.pick(p) == answers[-1]
    assert None in answers and any(a is not None for a in answers)


def test_the_shipped_file_keeps_its_models_picks_and_a_compile_reads_them_without_xgboost(
        run_script):
    """The packaged grouped model's file keeps its own answers for the MoE shapes at every
    rung (scripts/train_cost_model.py writes them): a sample of them is what the model says,
    and a fresh process picks a dynamic size's table from them without importing XGBoost or
    the dataset's reader (pyarrow: 0.5-3 s of a compile)."""
    from cutetune.models.artifact import read_picks

    known = read_picks(None, kind="grouped")
    model = load_model(None, "sm90", "bf16", "grouped")
    sample = [GroupedProblem.from_key(k) for k in sorted(known)[::37]]
    assert len(known) > 1000 and len(sample) > 20
    assert model.picks(sample) == [known[p.key()] for p in sample]
    out = run_script(textwrap.dedent("""
        import json, sys
        from cutetune.tuner.kernels import grouped_mm as gmm
        from cutetune.space.suites import MOE_MODELS, expert_gemm, expert_projections
        layer = MOE_MODELS["qwen3_30b_a3b"]
        p = expert_gemm("wgrad", layer.experts, 8192, *expert_projections(layer)["down"])
        table = gmm.picker().table(lambda s: gmm.with_ragged(p, s), True)
        print(json.dumps({"ranges": len(table), "xgboost": "xgboost" in sys.modules,
                          "pyarrow": "pyarrow" in sys.modules}))
        """))
    assert out == {"ranges": out["ranges"], "xgboost": False, "pyarrow": False}
    assert out["ranges"] > 1


def test_picks_the_file_keeps_come_first_the_model_answers_the_rest(tmp_path):
    """A kept pick answers its problem whatever the model would say; another problem, or one
    whose kept pick the rules now reject (split-K on a grouped GEMM), gets the model's."""
    p, other, stale = (GroupedProblem(8, m, 4096, 7168) for m in (1024, 2048, 4096))
    model = load_model(None, "sm90", "bf16", "grouped")
    path = replace(model, known_picks={p.key(): CONFIG, stale.key(): replace(CONFIG, split_k=2)}
                   ).save(tmp_path / "m.json")
    assert load_model(path, kind="grouped").known_picks == {p.key(): CONFIG}
    picker = gmm.Picker(path)
    assert picker.pick(p) == CONFIG
    assert [picker.pick(other), picker.pick(stale)] == model.picks([other, stale])


def test_a_missing_model_runs_aten_with_a_warning(tmp_path, caplog):
    picker = gmm.Picker(tmp_path / "nope.json")
    with caplog.at_level(logging.WARNING, logger=gmm.log.name):
        assert picker.pick(GroupedProblem(8, 1024, 4096, 7168)) is None
    assert "does not exist" in caplog.text
    assert picker.digest() != gmm.Picker().digest()  # the packaged model's bytes


def test_a_dynamic_size_gets_a_pick_per_range():
    picker = gmm.Picker(Stub())
    base = GroupedProblem(8, 1024, 4096, 7168)
    table = picker.table(lambda m: gmm.with_ragged(base, m), dynamic=True)
    assert table == ((M_UNBOUNDED, CONFIG),)
    static = picker.table(lambda m: gmm.with_ragged(base, m), dynamic=False, total=1000)
    assert static == ((M_UNBOUNDED, CONFIG),)
    bad = picker.table(lambda m: gmm.with_ragged(base, m * 0), dynamic=True)  # ProblemError
    assert bad == ((M_UNBOUNDED, None),)


# ---------------------------------------------------------------- the op, off the GPU
def test_the_op_matches_torch_grouped_mm_with_gradients():
    a, w, offs = operands(counts=(16, 0, 8, 40))  # an empty expert
    gy = torch.randn(64, 48, dtype=BF16)
    a2, w2 = (t.detach().clone().requires_grad_() for t in (a, w))
    y = cutetune.grouped_mm(a, w.mT, offs)
    y.backward(gy)
    y2 = torch._grouped_mm(a2, w2.mT, offs=offs)
    y2.backward(gy)
    assert torch.equal(y, y2) and torch.equal(a.grad, a2.grad) and torch.equal(w.grad, w2.grad)
    assert y.is_contiguous()


def test_the_varlen_k_form_runs_without_a_backward():
    a, w, offs = operands()
    dy = torch.randn(64, 48, dtype=BF16)
    out = cutetune.grouped_mm(dy.mT, a.detach(), offs)
    assert torch.equal(out, torch._grouped_mm(dy.mT, a.detach(), offs=offs))
    assert out.shape == (4, 48, 32)
    with pytest.raises(RuntimeError, match="varlen M"):
        cutetune.grouped_mm(dy.mT.requires_grad_(), a.detach(), offs).sum().backward()


def test_a_table_picks_the_range_of_the_call_and_cpu_runs_aten():
    a, w, offs = operands()
    table = problems.table_ints(((32, None), (M_UNBOUNDED, CONFIG)))
    out = torch.ops.cutetune.grouped_mm(a.detach(), w.detach().mT, offs, table)
    assert torch.equal(out, torch._grouped_mm(a.detach(), w.detach().mT, offs=offs))
    assert gmm.launched_via(a, w.mT, offs, table) is None  # no GPU: ATen


# ---------------------------------------------------------------- compiled graphs
@pytest.fixture
def stub_pass():
    """The grouped pass with the stub model, deciding as if the CPU were an sm90 GPU: the
    graph gets quack's tables, and the kernel's call then runs ATen (no GPU here)."""
    picker = gmm.Picker(Stub())
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False, post_grad_custom_post_pass=GroupedMmPass(
            picker, "test", lambda device: "sm90")):
        yield picker
    torch._dynamo.reset()


def _grouped(a, w, offs):
    return torch._grouped_mm(a, w.mT, offs=offs)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_forward_and_backward_get_the_picks(stub_pass, dynamic):
    a, w, offs = operands()
    if dynamic:
        torch._dynamo.mark_dynamic(a, 0)
    compiled = torch.compile(_grouped)
    y, codes = run_and_get_code(lambda: compiled(a, w, offs))
    code = codes[0]  # the forward's (a dynamic graph's backward is compiled with it)
    assert code.count(f"{gmm.GROUPED_MM_KERNEL}(") == 1
    assert f"table=({M_UNBOUNDED}, 128, 128," in code
    gy = torch.randn(64, 48, dtype=BF16)
    y.backward(gy)
    a2, w2 = (t.detach().clone().requires_grad_() for t in (a, w))
    ref = _grouped(a2, w2, offs)
    ref.backward(gy)
    assert torch.equal(y, ref) and torch.equal(a.grad, a2.grad) and torch.equal(w.grad, w2.grad)
    # forward and input gradient: varlen M; weight gradient: varlen K, which the stub leaves
    # to ATen (so its node stays aten._grouped_mm)
    assert {p.gemm for p in stub_pass.picks_} == {"fwd", "dgrad", "wgrad"}


def test_nodes_the_pass_must_not_touch_stay(stub_pass):
    a, w, offs = operands()

    def with_out_dtype(a, w, offs):
        return torch._grouped_mm(a, w.mT, offs=offs, out_dtype=torch.bfloat16) + 1

    def symbolic_k(a, w, offs):
        return torch._grouped_mm(a, w.mT, offs=offs)

    _, (code,) = run_and_get_code(torch.compile(with_out_dtype), a.detach(), w.detach(), offs)
    assert gmm.GROUPED_MM_KERNEL in code  # out_dtype equal to the input's is the default
    torch._dynamo.reset()
    _, (code,) = run_and_get_code(torch.compile(symbolic_k, dynamic=True), a.detach(),
                                  w.detach(), offs)
    assert gmm.GROUPED_MM_KERNEL not in code  # N and K symbolic: no problem, ATen


def test_enable_chains_the_grouped_pass_after_swiglu_the_gemvs_and_the_users():
    def users(graph):
        pass

    with inductor_config.patch(post_grad_custom_post_pass=users):
        with iin.enable("predicted"):
            slot = inductor_config.post_grad_custom_post_pass
            assert isinstance(slot, GroupedMmPass)
            assert isinstance(slot.user_pass, SwigluFusionPass)
            assert isinstance(slot.user_pass.user_pass, GemvPass)
            assert slot.user_pass.user_pass.user_pass is users
            with iin.enable("predicted", fuse_swiglu=False):
                inner = inductor_config.post_grad_custom_post_pass
                assert isinstance(inner, GroupedMmPass) and isinstance(inner.user_pass, GemvPass)
                assert inner.user_pass.user_pass is users
            assert inductor_config.post_grad_custom_post_pass is slot
        assert inductor_config.post_grad_custom_post_pass is users


def test_the_model_comes_from_the_setting(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUTETUNE_GROUPED_MODEL", str(tmp_path / "mine.json"))
    picker = gmm.Picker()
    with caplog.at_level(logging.WARNING, logger=gmm.log.name):
        assert picker.pick(GroupedProblem(8, 1024, 4096, 7168)) is None
    assert "mine.json" in caplog.text
    digest = picker.digest()  # read once: what the picks come from keys the compiles
    monkeypatch.setenv("CUTETUNE_GROUPED_MODEL", str(tmp_path / "other.json"))
    (tmp_path / "other.json").write_text("{}")
    assert picker.digest() == digest and gmm.Picker().digest() != digest
    (tmp_path / "mine.json").write_text("{}")  # rewritten: the loaded model is the old one
    assert picker.digest() == digest


# ---------------------------------------------------------------- kernels built meanwhile
def test_the_pass_hands_each_nodes_kernels_to_prepare():
    picker, handed = gmm.Picker(Stub()), []
    a, w, offs = operands()
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False, post_grad_custom_post_pass=GroupedMmPass(
            picker, "test-prepare", lambda device: "sm90", prepare=handed.append)):
        torch._dynamo.mark_dynamic(a, 0)
        torch.compile(_grouped)(a, w, offs).backward(torch.randn(64, 48, dtype=BF16))
    torch._dynamo.reset()
    # forward and input gradient (the stub leaves the weight gradient to ATen): one kernel
    # each, whichever rung it was picked at
    assert sorted(p.gemm for kernels in handed for p, _ in kernels) == ["dgrad", "fwd"]
    assert all(c == CONFIG for kernels in handed for _, c in kernels)


def test_a_kernel_the_helper_still_builds_runs_aten_meanwhile():
    problem = GroupedProblem(8, 1024, 4096, 7168)
    plan = gmm.GroupedPlan(CONFIG, problem)
    call = (torch.empty(2, 2),)
    assert not gmm._Grouped.pending(plan, call)  # nothing handed to a helper
    state = ["pending"]
    gmm.building(problem, CONFIG, lambda: state[0])
    other_rows = gmm.GroupedPlan(CONFIG, gmm.with_ragged(problem, 64))
    # the same kernel as the helper files it: another swizzle is a run-time knob
    other_swizzle = gmm.GroupedPlan(replace(CONFIG, max_swizzle_size=4), problem)
    assert gmm._Grouped.pending(plan, call) and gmm._Grouped.pending(other_rows, call)
    assert gmm._Grouped.pending(other_swizzle, call)
    state[0] = "done"
    assert not gmm._Grouped.pending(plan, call)
    state[0] = "failed: it crashed"  # then the first call compiles it here, or retires to ATen
    assert not gmm._Grouped.pending(plan, call)
    gmm._builds.clear()


def test_a_call_that_runs_aten_meanwhile_makes_no_quack_offsets(monkeypatch):
    """quack's zero-led offsets are made for its launch alone: a call the helper's build
    defers to ATen launches nothing else."""
    a, w, offs = (t.detach() for t in operands())
    problem = grouped(a, w.mT, 4)
    monkeypatch.setattr(gmm, "_plans", {})
    monkeypatch.setattr(gmm, "_build_plan", lambda *args: gmm.GroupedPlan(CONFIG, problem))
    pads = []
    pad = torch.nn.functional.pad
    monkeypatch.setattr(torch.nn.functional, "pad", lambda *args: pads.append(1) or pad(*args))
    gmm.building(problem, CONFIG, lambda: "pending")
    try:
        out = gmm.grouped_mm_impl(a, w.mT, offs)
    finally:
        gmm._builds.clear()
    assert torch.equal(out, torch._grouped_mm(a, w.mT, offs=offs)) and not pads


def test_the_helper_takes_grouped_kernels():
    from cutetune.tuner.kernels import helper

    problem = GroupedProblem(8, 1024, 4096, 7168, gemm="dgrad")
    assert helper.kernel_key(problem, CONFIG)[5] == "dgrad"  # quack's disk cache, no library
    built, _ = helper._job("sm90", "gemm", problem.to_dict(), CONFIG.to_dict())
    assert built in (True, False)


def test_the_grouped_models_code_keys_the_fx_cache():
    """The grouped pass runs the cost model at compile time: the code that turns the model
    file into picks is cutetune code that decides a graph, so in its FX-cache key."""
    from cutetune.models import artifact, fallback, features, kinds, learners
    from cutetune.tuner.inductor.cache_key import decision_sources

    readers = {Path(m.__file__).resolve() for m in (artifact, fallback, features, kinds, learners)}
    assert readers <= set(decision_sources())


def test_make_fx_traces_the_op_not_its_launch():
    from torch.fx.experimental.proxy_tensor import make_fx

    a, w, offs = operands()
    graph = make_fx(lambda a, w, o: cutetune.grouped_mm(a, w.mT, o))(a.detach(), w.detach(), offs)
    assert any(n.target is torch.ops.cutetune.grouped_mm.default for n in graph.graph.nodes)


# ---------------------------------------------------------------- reduced mode
def test_reduced_mode_benchmarks_the_top_k_among_inductors_candidates(monkeypatch):
    """Static sizes: Inductor's own grouped lowering, with the model's top-k quack configs
    added to what it benchmarks (here on the CPU: ATen, and the quack choices, which run ATen
    off the GPU); the pass leaves those nodes to it."""
    from torch._inductor.kernel import mm_grouped

    from cutetune.tuner.inductor import grouped

    seen = []
    select = mm_grouped.autotune_select_algorithm

    def spy(name, choices, *args, **kwargs):
        seen.append([getattr(c, "description", "") for c in choices])
        return select(name, choices, *args, **kwargs)

    monkeypatch.setattr(mm_grouped, "autotune_select_algorithm", spy)
    picker = gmm.Picker(Stub())
    previous = grouped.install(picker, 2, lambda device: "sm90")
    try:
        torch._dynamo.reset()
        with inductor_config.patch(fx_graph_cache=False, post_grad_custom_post_pass=GroupedMmPass(
                picker, "test-reduced", lambda device: "sm90", static=False)):
            a, w, offs = operands()
            y = torch.compile(_grouped)(a, w, offs)
            gy = torch.randn(64, 48, dtype=BF16)
            y.backward(gy)
    finally:
        grouped.uninstall(previous)
        torch._dynamo.reset()
    a2, w2 = (t.detach().clone().requires_grad_() for t in (a, w))
    ref = _grouped(a2, w2, offs)
    ref.backward(gy)
    assert torch.equal(y, ref) and torch.equal(a.grad, a2.grad) and torch.equal(w.grad, w2.grad)
    # forward, input and weight gradients: each node benchmarked with the stub's config
    # added (it ranks one config, whatever top_k)
    assert len(seen) == 3 and all(CONFIG.short() in names for names in seen)
    assert mm_grouped.autotune_select_algorithm is spy  # put back after each lowering


@pytest.mark.parametrize("inner", ["predicted", "off"])
def test_another_mode_inside_reduced_lowers_with_inductors_own(inner):
    """An installation of another mode inside a reduced one lowers grouped GEMMs as Inductor
    does (its post-grad pass gives them their tables), and the reduced one's lowering comes
    back when it ends, in either order of disabling."""
    from torch._inductor.kernel import mm_grouped  # noqa: F401
    from torch._inductor.lowering import lowerings

    from cutetune.tuner.inductor import grouped

    own = lowerings[grouped._GROUPED_MM]
    outer = iin.enable("reduced", prefetch=False)
    reduced = lowerings[grouped._GROUPED_MM]
    assert isinstance(reduced, grouped.ReducedLowering) and reduced.original is own
    with iin.enable(inner):
        assert lowerings[grouped._GROUPED_MM] is own
    assert lowerings[grouped._GROUPED_MM] is reduced
    nested = iin.enable(inner)
    outer.disable()
    assert lowerings[grouped._GROUPED_MM] is own
    nested.disable()
    assert lowerings[grouped._GROUPED_MM] is own and not grouped.installed()


def test_reduced_mode_without_a_model_leaves_inductor_its_own_lowering(tmp_path):
    from cutetune.tuner.inductor import grouped

    calls = []
    lowering = grouped.ReducedLowering(lambda *args: calls.append(args) or "inductor's",
                                       gmm.Picker(tmp_path / "none.json"), 2,
                                       lambda device: "sm90")
    a = torch.empty(64, 32, dtype=BF16)

    class Node:  # what the lowering reads before Inductor lays the inputs out
        def get_dtype(self):
            return a.dtype

        def get_device(self):
            return a.device

    with V.set_graph_handler(types.SimpleNamespace(cpp_wrapper=False)):
        assert lowering(Node(), Node(), Node()) == "inductor's" and len(calls) == 1
    assert not gmm.Picker(tmp_path / "none.json").has_model("sm90", BF16)
    assert gmm.Picker(Stub()).has_model("sm90", torch.bfloat16)
    assert not gmm.Picker(Stub()).has_model("sm90", torch.float32)


def test_reduced_mode_under_the_cpp_wrapper_leaves_inductor_its_own_lowering():
    """The C++ wrapper cannot call a quack choice (a Python function): no quack candidates,
    as the extern lowerings of the op and of the fused SwiGLU leave it."""
    from torch._inductor.kernel import mm_grouped

    from cutetune.tuner.inductor import grouped

    calls, select = [], mm_grouped.autotune_select_algorithm
    # what Inductor's lowering would select with: its own selection, no quack choices added
    lowering = grouped.ReducedLowering(
        lambda *args: calls.append(mm_grouped.autotune_select_algorithm) or "inductor's",
        gmm.Picker(Stub()), 2, lambda device: "sm90")

    class Node:
        def get_dtype(self):
            return BF16

        def get_device(self):
            return torch.device("cpu")

    with V.set_graph_handler(types.SimpleNamespace(cpp_wrapper=True)):
        assert lowering(Node(), Node(), Node()) == "inductor's" and calls == [select]


def test_reduced_mode_gives_static_cutetune_op_nodes_their_table():
    """Reduced mode's lowering wraps aten._grouped_mm only: a static node of cutetune's own op
    (a user's cutetune.grouped_mm, and its backward's) gets the picker's table as in predicted
    mode, not a dispatcher call that picks per rung at run time."""
    picker = gmm.Picker(Stub())
    torch._dynamo.reset()
    try:
        with inductor_config.patch(fx_graph_cache=False, post_grad_custom_post_pass=GroupedMmPass(
                picker, "test-reduced", lambda device: "sm90", static=False)):
            a, w, offs = operands()
            _, (ours,) = run_and_get_code(torch.compile(
                lambda a, w, o: cutetune.grouped_mm(a, w.mT, o)), a.detach(), w.detach(), offs)
            torch._dynamo.reset()
            _, (aten,) = run_and_get_code(torch.compile(_grouped), a.detach(), w.detach(), offs)
    finally:
        torch._dynamo.reset()
    assert f"{gmm.GROUPED_MM_KERNEL}(" in ours and f"table=({M_UNBOUNDED}, 128, 128," in ours
    assert gmm.GROUPED_MM_KERNEL not in aten  # left to the lowering (not installed here)


def test_train_cost_model_writes_the_picks_into_a_grouped_model_file(tmp_path, monkeypatch):
    """--picks-only writes the model's picks for ``moe_rung_problems`` into the file as it is
    (here three of them); the dense model gets none."""
    import importlib.util
    import shutil

    from cutetune.models.artifact import read_picks, shipped_model_path

    spec = importlib.util.spec_from_file_location(
        "train_cost_model", Path(__file__).resolve().parent.parent / "scripts" /
        "train_cost_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert len(script.moe_rung_problems()) >= 1000
    few = script.moe_rung_problems()[:3]
    monkeypatch.setattr(script, "moe_rung_problems", lambda: few)
    out = tmp_path / "grouped.json.gz"  # gzipped, as the shipped file
    shutil.copy(shipped_model_path(kind="grouped"), out)
    assert script.main(["--shipped", "grouped", "--picks-only", "--out", str(out)]) == 0
    model = load_model(out, kind="grouped")
    assert read_picks(out, kind="grouped") == dict(zip((p.key() for p in few), model.picks(few)))
    with pytest.raises(SystemExit):
        script.main(["--shipped", "dense", "--picks-only"])
