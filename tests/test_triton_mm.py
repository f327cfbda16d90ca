"""The Triton mm table predicted mode uses for host-bound, memory-bound mm: fitting from a
sweep, held-out scoring, the heuristics file that carries it, and the decision that reads it."""

from __future__ import annotations

import gzip
import json

import pytest

from cutetune.models.triton_mm import (CONFIG_KEYS, NARROW_N, LaunchCosts, RetimedShape,
    StepHostCosts, TritonTable, fit, fit_launch_costs, gpu_features, holdout, load_retimed,
    load_sweep, m_bucket, step_host_us)
from cutetune.space.device import device_for
from cutetune.space.problem import GemmProblem
from cutetune.tuner.inductor import choices as ich, decisions as idec, feedback as ifb, install as iin
from cutetune.tuner.kernels import problems
from cutetune.models import triton_mm as tmm
from cutetune.models.heuristics import Grid, Heuristics, HeuristicsError, predicted_triton_shapes
from cutetune.artifacts import sealed_json

X = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 5, "num_warps": 2}
Y = {**X, "BLOCK_N": 64, "num_warps": 4}
Z = {**X, "BLOCK_N": 128, "num_stages": 4, "num_warps": 8}


def sweep_row(m, n, k, aten_us, triton_us: dict, majors="kk", **extra):
    """A row as scripts/triton_mm_sweep.py writes it; triton_us maps a config name to us."""
    configs = {"X": X, "Y": Y, "Z": Z}
    choices = [{"kind": "aten", "name": "mm", "ms": aten_us / 1e3}]
    choices += [{"kind": "triton", "name": f"triton_mm_{c}", "config": configs[c],
                 "ms": t / 1e3} for c, t in triton_us.items()]
    return {"m": m, "n": n, "k": k, "majors": majors, "dtype": "bf16", "device": "NVIDIA H200",
            "choices": choices, **extra}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def key(c: dict) -> tuple:
    return tuple(c[k] for k in CONFIG_KEYS)


ROWS = [
    # wide N at the M<=16 bucket: Y fits the group best (X wins one shape); ATen slower
    sweep_row(1, 4096, 4096, 20.0, {"X": 12.0, "Y": 10.0, "Z": 15.0}),
    sweep_row(16, 4096, 4096, 20.0, {"X": 8.0, "Y": 11.0, "Z": 15.0}),
    sweep_row(1, 8192, 4096, 30.0, {"X": 26.0, "Y": 20.0, "Z": float("inf")}),  # Z failed here
    # narrow N: X wins; ATen faster than any Triton config at M=4
    sweep_row(4, 1024, 4096, 5.0, {"X": 8.0, "Y": 9.0, "Z": 12.0}),
    sweep_row(4, 2048, 2048, 15.0, {"X": 7.0, "Y": 9.0, "Z": 12.0}),
]


def test_m_bucket_follows_inductors_block_m_sizing():
    assert [m_bucket(m) for m in (1, 4, 16, 17, 32, 33, 100, 128, 129)] == [
        16, 16, 16, 32, 32, 64, 128, 128, 256]


def test_load_sweep_skips_errors_and_failed_configs(tmp_path):
    p = write(tmp_path / "s.jsonl", [*ROWS, {"m": 1, "n": 1, "k": 1, "majors": "kk",
                                             "error": "RuntimeError: boom"}])
    shapes = load_sweep(p)
    assert len(shapes) == len(ROWS)
    assert key(Z) not in shapes[2].triton_ms  # inf: a config Inductor could not run
    assert shapes[0].aten_ms == pytest.approx(0.020) and shapes[0].device == "NVIDIA H200"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_sweep(bad)
    packed = tmp_path / "s.jsonl.gz"  # a committed sweep is stored compressed
    packed.write_bytes(gzip.compress(p.read_bytes()))
    assert load_sweep(packed) == shapes
    # reduced mode's benchmark of a graph the launch costs gave Triton holds no ATen choice
    triton_only = sweep_row(4, 4096, 4096, 1.0, {"Y": 9.0})
    triton_only["choices"] = [c for c in triton_only["choices"] if c["kind"] != "aten"]
    (shape,) = load_sweep(write(tmp_path / "t.jsonl", [triton_only]))
    assert shape.aten_ms is None and shape.triton_ms == {key(Y): pytest.approx(0.009)}


def test_fit_picks_per_bucket_and_width(tmp_path):
    picks = {(p.m_bucket, p.wide): p for p in fit(load_sweep(write(tmp_path / "s", ROWS)))}
    assert set(picks) == {(16, True), (16, False)}
    wide, narrow = picks[16, True], picks[16, False]
    # Z failed on one wide shape, so it is not offered for the group; Y's geomean is best
    assert wide.config == key(Y) and wide.shapes == 3
    assert wide.vs_best_triton == pytest.approx((1.0 * 11 / 8 * 1.0) ** (1 / 3))
    assert narrow.config == key(X) and narrow.shapes == 2
    assert NARROW_N == 2048  # 2048 is narrow, 4096 wide


def test_table_lookup_by_group(tmp_path):
    table = TritonTable.from_sweep(load_sweep(write(tmp_path / "s", ROWS)))
    assert table.config(problem(8, 4096)) == Y  # the group's pick, any M in the bucket
    assert table.config(problem(2, 14336)) == Y  # an unmeasured wide N too
    assert table.config(problem(1, 512)) == X  # narrow N: its group's pick
    assert table.config(problem(64, 4096)) is None  # no measurement at this M bucket
    kn = GemmProblem(1, 4096, 4096, 1, "bf16", "bf16", "k", "n", "sm90")
    assert table.config(kn) is None  # nor for these operand majors
    again = TritonTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.picks == table.picks
    with pytest.raises(ValueError, match="config keys"):
        TritonTable.from_json({**table.to_json(), "config_keys": ["BLOCK_M"]})
    with pytest.raises(ValueError, match="malformed"):
        TritonTable.from_json({"config_keys": list(CONFIG_KEYS)})


def problem(m, n, k=4096):
    return GemmProblem(m, n, k, 1, "bf16", "bf16", "k", "k", "sm90")


def test_gpu_features_follow_the_ceiling_and_the_tiles_per_sm():
    one, ceiling_us, k_per_share = gpu_features(problem(1, 4096), key(Y))
    assert one == 1.0
    sm90 = device_for("sm90")
    assert ceiling_us == pytest.approx((4096 * 4096 + 2 * 4096) * 2
                                       / sm90.mem_bw_bytes_per_s * 1e6)
    assert k_per_share == pytest.approx(4.096 / (64 / sm90.sm_count))  # 1 x 64 output tiles
    assert gpu_features(problem(1, 16384), key(Y))[2] == pytest.approx(4.096)  # all SMs busy


# GPU times (us) that a model linear in gpu_features reproduces exactly
ATEN_COEF, TRITON_COEF = (6.0, 1.1, 0.1), (7.0, 1.2, 0.9)


def retimed(shapes):
    def t(coef, p):
        return sum(c * x for c, x in zip(coef, gpu_features(p, key(Y))))
    return [RetimedShape(p, key(Y), t(ATEN_COEF, p), t(TRITON_COEF, p)) for p in shapes]


def test_fit_launch_costs_recovers_linear_gpu_times():
    shapes = [problem(m, n, k) for m in (1, 64) for n in (1024, 4096, 14336) for k in (2048, 8192)]
    host = StepHostCosts(30.0, 20.0, (0.8, 1.5))
    costs = fit_launch_costs(retimed(shapes), host)
    assert costs.aten_coef == pytest.approx(ATEN_COEF) and costs.triton_coef == pytest.approx(
        TRITON_COEF)
    assert (costs.aten_host_us, costs.triton_host_us, costs.host_factors) == (30.0, 20.0,
                                                                              (0.8, 1.5))
    with pytest.raises(ValueError, match="cannot fit"):
        fit_launch_costs(retimed(shapes[:3]), host)


def test_launch_costs_take_measured_gpu_times_over_the_model():
    """A shape retimed with a pick is decided by its measurement; the same shape with another
    config, or another shape, by the model. The measurements travel with the JSON."""
    shapes = [problem(m, n, k) for m in (1, 64) for n in (1024, 4096, 14336) for k in (2048, 8192)]
    off = RetimedShape(problem(16, 4096), key(Y), 11.0, 13.0)  # far from the linear model
    costs = fit_launch_costs([*retimed(shapes), off], StepHostCosts(30.0, 20.0, (1.0, 1.0)))
    assert (costs.gpu_us(off.problem, key(Y), False), costs.gpu_us(off.problem, key(Y), True)
            ) == (11.0, 13.0)
    assert costs.gpu_us(off.problem, key(X), True) != 13.0
    assert costs.gpu_us(problem(32, 4096), key(Y), True) != 13.0
    again = LaunchCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs and again.gpu_us(off.problem, key(Y), True) == 13.0


def test_a_retimed_problem_gets_the_config_that_ran_it_fastest(tmp_path):
    """Where several Triton configs were retimed on a problem, the table gives it the fastest
    and the launch costs weigh that config's measured time; other problems keep their group's
    pick. ATen's fit takes each shape once (its pick's row), so extra configs do not move it."""
    shapes = [problem(m, n, k) for m in (1, 64) for n in (1024, 4096, 14336) for k in (2048, 8192)]
    p = problem(1, 14336)
    rows = [*retimed(shapes), RetimedShape(p, key(Y), 33.0, 38.0, "pick"),
            RetimedShape(p, key(Z), 99.0, 34.0, "sweep_2")]  # ATen timed again: off-model
    table = TritonTable.from_sweep(load_sweep(write(tmp_path / "s", ROWS)),
                                   fit_launch_costs(rows, StepHostCosts(30.0, 20.0, (1.0, 1.0))))
    assert table.costs.aten_coef == pytest.approx(ATEN_COEF, rel=0.2)  # 33 us: near the model
    assert table.config(p) == Z and table.costs.gpu_us(p, key(Z), True) == 34.0
    assert table.config(problem(2, 14336)) == Y  # not retimed: the group's pick
    assert table.config(problem(1, 4096)) == Y  # retimed with its pick alone
    again = TritonTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.config(p) == Z and again.costs == table.costs


def test_launch_costs_take_triton_while_the_step_stays_host_bound():
    """Triton launches cost the host 20 us instead of 30 but run 10 % longer on the GPU:
    worth it while the GPU time stays under the host time."""
    costs = LaunchCosts(30.0, 20.0, (0.0, 1.0, 0.0), (0.0, 1.1, 0.0))
    small, big = problem(1, 4096), problem(1, 4096, 65536)  # ~7 us and ~112 us at the ceiling
    assert costs.triton_problems([(small, key(Y))] * 4) == {small}
    assert costs.triton_problems([(big, key(Y))] * 3) == set()
    assert costs.triton_problems([]) == set()
    # a step is the longer of host and GPU time; no GEMM beats the ceiling
    assert costs.step_us([(small, key(Y))] * 4, [True] * 4) == pytest.approx(80.0)
    assert costs.step_us([(small, key(Y))] * 4, [True] * 4, 2.0) == pytest.approx(160.0)
    assert costs.gpu_us(big, key(Y), False) == pytest.approx(gpu_features(big, key(Y))[1])
    below = LaunchCosts(30.0, 20.0, (-50.0, 1.0, 0.0), (0.0, 1.0, 0.0))
    assert below.gpu_us(small, key(Y), False) == gpu_features(small, key(Y))[1]
    assert LaunchCosts.from_json(costs.to_json()) == costs
    with pytest.raises(ValueError, match="3 values"):
        LaunchCosts.from_json({**costs.to_json(), "aten_coef": [1.0]})
    with pytest.raises(ValueError, match="host factors"):
        LaunchCosts.from_json({**costs.to_json(), "host_factors": [1.5, 0.8]})
    with pytest.raises(ValueError, match="not all finite"):
        LaunchCosts.from_json({**costs.to_json(), "triton_coef": [0.0, float("nan"), 0.0]})
    measured = {**problem(1, 4096).to_dict(), "aten_us": 10.0, "triton_us": 12.0,
                "variant": "pick"}
    for row, match in (({**measured, "config": list(key(Y))[:5]}, "needs 6 values"),
                       ({**measured, "config": list(key(Y)), "aten_us": 0.0}, "not positive")):
        with pytest.raises(ValueError, match=match):
            LaunchCosts.from_json({**costs.to_json(), "measured": [row]})


def test_launch_costs_hedge_over_the_host_speeds_seen():
    """Two problems, two nodes each (GPU us on ATen/Triton): one that Triton costs no GPU time
    (30/30), one it costs 6 us more (20/26). On a host of the median speed (30 us of host per
    ATen launch, 20 per Triton) ATen's step is host-bound at 120 us; Triton for the free one
    makes it 100 (GPU-bound), for both 112: the free one alone. Where hosts run up to 1.5x
    slower, that choice can take 150 us where both take 120 (1.25x), while both cost at most
    1.12x the best on the median host: both."""
    free, costly = problem(1, 4096), problem(1, 1024)
    gpu = {free: (30.0, 30.0), costly: (20.0, 26.0)}

    class Fixed(LaunchCosts):
        def gpu_us(self, p, config, triton):
            return gpu[p][triton]

    gemms = [(free, key(Y)), (costly, key(Y)), (free, key(Y)), (costly, key(Y))]
    median_host = Fixed(30.0, 20.0, (0.0,) * 3, (0.0,) * 3)
    assert median_host.triton_problems(gemms) == {free}
    slow_hosts = Fixed(30.0, 20.0, (0.0,) * 3, (0.0,) * 3, (1.0, 1.5))
    assert slow_hosts.triton_problems(gemms) == {free, costly}
    # the price of hedging: 112 us where the median host's best (the free one alone) takes 100
    assert slow_hosts.least_regret(gemms) == pytest.approx(1.12)
    assert median_host.least_regret(gemms) == 1.0 and median_host.least_regret([]) == 1.0
    assert slow_hosts.step_us(gemms, [True, False, True, False], 1.5) == pytest.approx(150.0)
    # a tie keeps ATen: where the step is GPU-bound either way, no Triton compile
    gpu[free] = (60.0, 60.0)
    assert median_host.triton_problems(gemms[::2]) == set()


def step_part(workloads, m=1):
    """A scripts/step_ab.py part: workload -> (default kernels, predicted kernels, host us of
    each)."""
    def kernels(aten, triton):
        return {"quack": 0, "aten": aten, "triton_template": triton}
    return {"m": m, "workloads": {
        w: {"kernels": {"default": kernels(*d), "predicted": kernels(*p)},
            "host_us": {"default": hd, "predicted": hp}, "graphs_compiled_when_timed": {}}
        for w, (d, p, hd, hp) in workloads.items()}}


def test_step_host_us_reads_workloads_all_aten_and_all_triton():
    parts = [step_part({"attn": ((4, 0), (0, 4), 100.0, 60.0),
                        "mlp": ((3, 0), (0, 3), 90.0, 66.0)}),
             step_part({"attn": ((4, 0), (0, 4), 140.0, 100.0),
                        "mixed": ((2, 1), (1, 2), 1e6, 1e6)})]  # neither all ATen nor Triton
    host = step_host_us([{"parts": parts}])
    assert (host.aten_us, host.triton_us) == (pytest.approx(30.0), pytest.approx(22.0))
    # spread per workload and kind: attn's ATen 25 and 35 around 30, its Triton 15 and 25
    assert host.factors == (pytest.approx(15 / 20), pytest.approx(25 / 20))
    with pytest.raises(ValueError, match="no step benchmark"):
        step_host_us([{"parts": [step_part({"mixed": ((3, 0), (1, 2), 1.0, 1.0)})]}])
    # what says nothing of the host: a GPU-bound M, a mode the report does not count, a mode
    # timed on code compiled again
    gpu_bound = step_part({"attn": ((4, 0), (0, 4), 900.0, 900.0)}, m=1024)
    not_counted = step_part({"attn": ((4, 0), (0, 4), 100.0, 900.0)})
    again = step_part({"attn": ((4, 0), (0, 4), 100.0, 900.0)})
    again["workloads"]["attn"]["graphs_compiled_when_timed"] = {"predicted": 1}
    more = [{"parts": [gpu_bound]}, {"parts": [not_counted], "not_counted": {
        "modes": ["predicted"], "why": "timed on the default's code"}}, {"parts": [again]}]
    with_more = step_host_us([{"parts": parts}, *more])
    # the defaults of the last two count: attn's ATen 25, 35, 25, 25 around 25
    assert with_more.triton_us == pytest.approx(22.0)
    assert with_more.factors == (pytest.approx(15 / 20), pytest.approx(35 / 25))
    # a report from before step_ab.py said which modes ran their own code is refused
    del again["workloads"]["attn"]["graphs_compiled_when_timed"]
    with pytest.raises(ValueError, match="M=1 \\(attn\\) has no graphs_compiled_when_timed"):
        step_host_us([{"parts": parts}, {"parts": [again]}])


def test_load_retimed_skips_errors_and_names_a_corrupt_line(tmp_path):
    timed = {"aten": {"ms": 0.010}, "pick": {"ms": 0.012, "config": Y},
             "sweep_best": {"ms": 0.011, "config": X}}
    ok = {"m": 1, "n": 4096, "k": 4096, "majors": "kk", "dtype": "bf16",
          "device": "NVIDIA H200", "timed": timed}
    path = write(tmp_path / "r.jsonl", [ok, {"m": 2, "n": 1, "k": 1, "majors": "kk",
                                             "error": "RuntimeError: boom"}])
    pick, best = load_retimed(path)  # one per Triton config timed beside ATen
    assert pick == RetimedShape(problem(1, 4096), key(Y), pytest.approx(10.0),
                                pytest.approx(12.0), "pick")
    assert best == RetimedShape(problem(1, 4096), key(X), pytest.approx(10.0),
                                pytest.approx(11.0), "sweep_best")
    bad = write(tmp_path / "bad.jsonl", [ok, {**ok, "timed": {**timed, "pick": {"ms": 1}}}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_retimed(bad)
    # a config that failed (no finite positive time) is no measurement, nor is ATen's
    failed = {**timed, "pick": {"ms": float("nan"), "config": Y}}
    (only,) = load_retimed(write(tmp_path / "f.jsonl", [{**ok, "timed": failed}, {
        **ok, "m": 2, "timed": {**timed, "aten": {"ms": 0.0}}}]))
    assert only.variant == "sweep_best"
    array = tmp_path / "a.jsonl"
    array.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"a.jsonl:1: TypeError: a JSON object expected"):
        load_retimed(array)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(path.read_bytes())[:-8])
    with pytest.raises(ValueError, match=r"corrupt retime file .*cut.jsonl.gz: EOFError"):
        load_retimed(cut)


def test_table_without_launch_costs_never_gives_triton(tmp_path):
    table = TritonTable.from_sweep(load_sweep(write(tmp_path / "s", ROWS)))
    gemms = [(problem(1, 4096), Y)]
    assert table.config(problem(1, 4096)) == Y and table.triton_problems(gemms) == set()
    table.costs = LaunchCosts(30.0, 20.0, (0.0, 1.0, 0.0), (0.0, 1.1, 0.0), (0.8, 1.5))
    assert table.triton_problems(gemms) == {problem(1, 4096)}
    again = TritonTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.costs == table.costs and again.triton_problems(gemms) == {problem(1, 4096)}


def test_holdout_scores_each_group_with_picks_fitted_without_it(tmp_path):
    shapes = load_sweep(write(tmp_path / "s", ROWS))
    rows = holdout(shapes, lambda s: "a" if s.n == 4096 else "b")
    # group a's wide shapes get b's wide pick: Y (b's only wide shape, 8192x4096)
    a = [r for r in rows if r["group"] == "a"]
    assert [r["config"] for r in a] == [Y, Y]
    assert a[1]["vs_best_triton"] == pytest.approx(11.0 / 8.0)
    assert [r["config"] for r in rows if r["group"] == "b"] == [X]  # a's wide pick
    # b's narrow shapes: group a has no narrow shape, so no pick to score them with
    assert all(r["group"] == "a" or r["n"] > NARROW_N for r in rows)


def test_predicted_triton_shapes_keep_host_and_memory_bound_ones(tmp_path):
    rows = [sweep_row(1, 4096, 4096, 20.0, {"X": 10.0}),  # 7.8 us at the ceiling, memory-bound
            sweep_row(1024, 4096, 4096, 40.0, {"X": 50.0}),  # host-bound but compute-bound
            sweep_row(1, 28672, 8192, 120.0, {"X": 120.0})]  # 109 us: not host-bound
    kept = predicted_triton_shapes(load_sweep(write(tmp_path / "s", rows)), "sm90", "bf16")
    assert [(s.m, s.n) for s in kept] == [(1, 4096)]
    assert predicted_triton_shapes(load_sweep(tmp_path / "s"), "sm90", "fp16") == []


def heuristics_with(table) -> Heuristics:
    return Heuristics("sm90", "bf16", 1, Grid(m=(1,), n=(16,), k=(16,)), (), [None] * 4, {},
                      triton=table)


def test_heuristics_file_carries_the_table(tmp_path):
    table = TritonTable.from_sweep(load_sweep(write(tmp_path / "s", ROWS)))
    path = heuristics_with(table).save(tmp_path / "h.json")
    h = Heuristics.load(path)
    p = GemmProblem(4, 4096, 4096, 1, "bf16", "bf16", "k", "k", "sm90")
    assert h.triton_config(p) == Y
    assert h.triton_config(GemmProblem(4, 4096, 4096, 2, "bf16", "bf16", "k", "k", "sm90")) is None
    with pytest.raises(HeuristicsError, match="sm90/bf16"):
        h.triton_config(GemmProblem(4, 4096, 4096, 1, "fp16", "fp16", "k", "k", "sm90"))
    assert Heuristics.load(heuristics_with(None).save(tmp_path / "none.json")).triton_config(p) is None
    d = json.loads(path.read_text())
    d["triton_mm"]["picks"][0]["config"] = {"BLOCK_M": 16}
    (tmp_path / "bad.json").write_bytes(sealed_json(d))  # sealed: the content is checked too
    with pytest.raises(HeuristicsError, match="corrupt heuristics file"):
        Heuristics.load(tmp_path / "bad.json")


def test_decide_gives_the_tables_config_in_predicted_mode(tmp_path):
    """A host-bound, memory-bound mm gets the table's config, unbenchmarked, in predicted mode;
    reduced mode benchmarks Inductor's Triton list unless the table's retime measured the
    shape: then it takes the config that ran it fastest, as predicted mode does."""
    h = heuristics_with(TritonTable.from_sweep(load_sweep(write(tmp_path / "s", ROWS))))
    limit = idec.QUACK_LAUNCH_HOST_US
    p = GemmProblem(4, 4096, 4096, 1, "bf16", "bf16", "k", "k", "sm90")
    d = idec.decide(p, "predicted", h, 1, limit)
    assert d.leave and d.aten and not d.triton and dict(d.triton_config) == Y
    d = idec.decide(p, "reduced", h, 5, limit)
    assert d.leave and d.triton and d.triton_config == ()
    compute_bound = GemmProblem(1024, 4096, 4096, 1, "bf16", "bf16", "k", "k", "sm90")
    assert idec.decide(compute_bound, "predicted", h, 1, limit).triton_config == ()
    no_table = GemmProblem(64, 4096, 4096, 1, "bf16", "bf16", "k", "k", "sm90")
    assert idec.decide(no_table, "predicted", h, 1, limit) == idec.NodeDecision(
        (), True, idec.decide(no_table, "predicted", h, 1, limit).reason, leave=True)
    assert idec.decide(no_table, "reduced", h, 5, limit).triton
    h.triton.costs = LaunchCosts(30.0, 20.0, (0.0, 1.0, 0.0), (0.0, 1.1, 0.0), (1.0, 1.0),
                                 (RetimedShape(p, key(Z), 20.0, 19.0, "sweep_2"),))
    for mode in ("predicted", "reduced"):
        d = idec.decide(p, mode, h, 5, limit)
        assert d.leave and not d.triton and dict(d.triton_config) == Z, mode
    other = GemmProblem(8, 4096, 4096, 1, "bf16", "bf16", "k", "k", "sm90")  # not retimed
    assert dict(idec.decide(other, "predicted", h, 1, limit).triton_config) == Y
    d = idec.decide(other, "reduced", h, 5, limit)
    assert d.triton and d.triton_config == ()


def test_cli_emit_adds_the_triton_table(tmp_path, monkeypatch, capsys):
    import cutetune.models
    from cutetune.cli import main

    from test_inductor import FakeModel

    monkeypatch.setattr(cutetune.models, "load_model", lambda *a, **k: FakeModel(),
                        raising=False)
    model_file = tmp_path / "model.bin"
    model_file.write_bytes(b"weights")
    # emit's grid, Grid(batch=...), made tiny; loading reads the file's own grid
    def grid(*args, **kwargs):
        if set(kwargs) == {"batch"} and not args:
            kwargs.update(m=(1,), n=(16,), k=(16,))
        return Grid(*args, **kwargs)

    monkeypatch.setattr("cutetune.models.heuristics.Grid", grid)
    sweep = write(tmp_path / "s.jsonl", ROWS)
    out = tmp_path / "h.json"
    assert main(["emit", "--model", str(model_file), "--out", str(out),
                 "--triton-sweep", str(sweep)]) == 0
    h = Heuristics.load(out)
    assert h.triton.config(problem(1, 4096)) == Y and h.meta["triton_sweep"] == [str(sweep)]
    compute_bound = write(tmp_path / "cb.jsonl", [sweep_row(1024, 4096, 4096, 40.0, {"X": 50.0})])
    assert main(["emit", "--model", str(model_file), "--out", str(out),
                 "--triton-sweep", str(compute_bound)]) == 2
    assert main(["emit", "--model", str(model_file), "--out", str(out),
                 "--triton-sweep", str(tmp_path / "missing.jsonl")]) == 2
    # launch costs: GPU times from a retime file, host times from step benchmarks
    shapes = [problem(m, n, k) for m in (1, 64) for n in (1024, 4096, 14336) for k in (2048, 8192)]
    rt = write(tmp_path / "rt.jsonl", [
        {"m": r.problem.m, "n": r.problem.n, "k": r.problem.k, "majors": "kk", "dtype": "bf16",
         "device": "NVIDIA H200", "timed": {"aten": {"ms": r.aten_us / 1e3},
                                             "pick": {"ms": r.triton_us / 1e3, "config": Y}}}
        for r in retimed(shapes)])
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"parts": [step_part({"attn": ((4, 0), (0, 4), 120.0, 80.0)})]}))
    costs = ["--triton-retimed", str(rt), "--triton-steps", str(steps)]
    assert main(["emit", "--model", str(model_file), "--out", str(out),
                 "--triton-sweep", str(sweep), *costs]) == 0
    h = Heuristics.load(out)
    assert h.triton.costs.triton_coef == pytest.approx(TRITON_COEF)
    assert (h.triton.costs.aten_host_us, h.triton.costs.triton_host_us) == (30.0, 20.0)
    assert h.triton_problems([(problem(1, 4096), Y)] * 4) == h.triton.costs.triton_problems(
        [(problem(1, 4096), key(Y))] * 4) == {problem(1, 4096)}
    # a problem retimed again in a later file takes that file's times, and its fastest config
    again = write(tmp_path / "rt2.jsonl", [
        {"m": 1, "n": 4096, "k": 2048, "majors": "kk", "dtype": "bf16", "device": "NVIDIA H200",
         "timed": {"aten": {"ms": 0.010}, "pick": {"ms": 0.013, "config": Y},
                   "sweep_best": {"ms": 0.011, "config": X}}}])
    for files, want in (([rt, again], X), ([again, rt], Y)):
        assert main(["emit", "--model", str(model_file), "--out", str(out),
                     "--triton-sweep", str(sweep), "--triton-retimed", *map(str, files),
                     "--triton-steps", str(steps)]) == 0
        assert Heuristics.load(out).triton_config(problem(1, 4096, 2048)) == want
    assert main(["emit", "--model", str(model_file), "--out", str(out),
                 "--triton-sweep", str(sweep), *costs[:2]]) == 2  # steps missing
    old = step_part({"attn": ((4, 0), (0, 4), 120.0, 80.0)})
    del old["workloads"]["attn"]["graphs_compiled_when_timed"]  # before step_ab.py recorded it
    for bad in ({}, {"parts": [old]}):
        steps.write_text(json.dumps(bad))
        assert main(["emit", "--model", str(model_file), "--out", str(out),
                     "--triton-sweep", str(sweep), *costs]) == 2
    assert "graphs_compiled_when_timed" in capsys.readouterr().err


def test_packaged_heuristics_weigh_each_dtype_by_its_own_file(monkeypatch):
    """A graph mixing bf16 and fp16 mm: each file weighs its own dtype's GEMMs (one file
    asked about the other's would refuse them, and the graph would lose every Triton
    config)."""
    from cutetune.models.heuristics import PackagedHeuristics

    class File:
        def __init__(self, dtype):
            self.dtype = dtype

        def triton_problems(self, gemms):
            assert {p.dtype for p, _ in gemms} == {self.dtype}
            return frozenset(p for p, _ in gemms if p.n == 4096)

    h = PackagedHeuristics()
    monkeypatch.setattr(h, "_file", lambda p: File(p.dtype))
    bf16, fp16 = problem(1, 4096), GemmProblem(1, 4096, 4096, 1, "fp16", "fp16", "k", "k")
    narrow = problem(1, 1024)
    assert h.triton_problems([(bf16, Y), (fp16, Y), (narrow, Y)]) == {bf16, fp16}
    assert h.triton_problems([]) == frozenset()


def retime_script():
    """scripts/triton_mm_retime.py, imported from its path."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "triton_mm_retime.py"
    spec = importlib.util.spec_from_file_location("triton_mm_retime", script)
    retime = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(retime)
    return retime


def test_retime_times_each_shapes_pick_and_the_sweeps_fastest_config_once(tmp_path):
    retime = retime_script()
    shapes = load_sweep(write(tmp_path / "s", ROWS))
    picks = TritonTable.from_sweep(shapes).picks  # wide: Y, narrow: X
    assert retime.candidates(shapes[0], picks) == {"pick": Y}  # Y was this shape's fastest
    assert retime.candidates(shapes[1], picks) == {"pick": Y, "sweep_best": X}
    assert retime.candidates(shapes[1], {}) == {"sweep_best": X}  # no pick for its group
    # the sweep's three fastest, the pick (Y, second fastest here) named once
    assert retime.candidates(shapes[1], picks, top=3) == {"pick": Y, "sweep_best": X,
                                                          "sweep_3": Z}
    forced = retime.ForcedTable(Z)
    assert forced.digest != retime.ForcedTable(X).digest


def test_retime_forces_its_triton_config_on_any_shape():
    """--family retimes shapes that are not host-bound too: with no host-bound limit the
    forced table gives a compute-bound shape, a host-bound compute-bound one (which the
    Triton table never answers) and a host-bound memory-bound one its config alone, in
    either mode, without a lookup (which raises)."""
    forced = retime_script().ForcedTable(Z)
    for p in (GemmProblem(8192, 8192, 8192), GemmProblem(2048, 2048, 2048),
              GemmProblem(1, 4096, 4096)):
        for mode, k in (("predicted", 1), ("reduced", 5)):
            d = idec.decide(p, mode, forced, k, 0.0)
            assert (d.leave, d.configs, dict(d.triton_config)) == (True, (), Z)


def test_retime_compiles_with_no_host_bound_limit(monkeypatch):
    """The retime's compile decides as under CUDA graphs, without Inductor's cudagraphs (its
    replays would copy the operands in), and rejects code that does not hold the config.
    CPU torch generates no Triton code: the stand-in for run_and_get_code asks the installed
    choices about a compute-bound mm and writes the tiles they give it."""
    import torch
    import torch._inductor.utils as iu
    from torch._inductor import config as inductor_config

    seen = []

    def stand_in(compile_graph):
        choices = inductor_config.inductor_choices_class()
        d = idec.decide(GemmProblem(8192, 8192, 8192), choices.mode, choices.heuristics,
                        choices.top_k, idec.host_bound_us())
        c = dict(d.triton_config)
        seen.append((idec.host_bound_us(), inductor_config.triton.cudagraphs, c))
        return torch.mm, [f"{k} : tl.constexpr = {c.get(k)}" for k in ("BLOCK_M", "BLOCK_N",
                                                                         "BLOCK_K")]

    monkeypatch.setattr(iu, "run_and_get_code", stand_in)
    retime = retime_script()
    a = torch.ones(2, 2)
    assert torch.equal(retime.compile_triton_mm(Z, a, a)(a, a, None), a @ a)
    assert seen == [(0.0, False, Z)]
    assert idec.host_bound_us() == idec.QUACK_LAUNCH_HOST_US  # the limit is back
    monkeypatch.setattr(iu, "run_and_get_code", lambda f: (torch.mm, ["extern_kernels.mm("]))
    with pytest.raises(RuntimeError, match="does not run Triton config"):
        retime.compile_triton_mm(Z, a, a)


def test_a_resumed_sweep_drops_a_torn_last_row_and_keeps_the_whole_ones(tmp_path):
    """A run killed in its write leaves part of a row: the resume cuts it off (its shape is
    measured again), so the next row starts a line; a bad row inside is named."""
    from cutetune.models.triton_sweep import append_row, shapes_in

    f = tmp_path / "rows.jsonl"
    rows = [{"m": m, "n": 64, "k": 32, "majors": "kk", "choices": []} for m in (1, 2, 3)]
    append_row(f, rows[0])
    append_row(f, rows[1])
    whole = f.read_bytes()
    f.write_bytes(whole + b'{"m": 3, "n": 6')
    assert shapes_in(f) == {(1, 64, 32, "kk"), (2, 64, 32, "kk")} and f.read_bytes() == whole
    append_row(f, rows[2])
    assert len(shapes_in(f)) == 3
    f.write_bytes(whole.rstrip(b"\n"))  # whole, but unended
    assert len(shapes_in(f)) == 2 and f.read_bytes() == whole
    f.write_bytes(b"garbage\n" + whole)
    with pytest.raises(ValueError, match=f"{f}, line 1: not a row"):
        shapes_in(f)
