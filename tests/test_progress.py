"""Progress of the long commands: a tqdm bar on stderr when it is a terminal; elsewhere (logs,
pipes, CI) no bar, with collect's status line and space check's per-config lines printed as
plain lines instead; --quiet silences it; stdout keeps only results."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from types import SimpleNamespace

import pytest

from cutetune import progress
from cutetune.cli import main
from cutetune.models import heuristics as hz
from cutetune.space import GemmProblem, KernelConfig
from cutetune.tuner.measure.collect import LOG_EVERY_S, Progress
from cutetune.tuner.measure.space_check import CompileResult

A = KernelConfig(128, 192, True, 2, 1, False, 8, 1, False)
B = KernelConfig(128, 128, False, 1, 1, True, 1, 1, False)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def terminal():
    """stderr as a terminal, in the test's body (capsys takes stderr when the body starts)."""
    return redirect_stderr(Terminal())


def _run_bar(**kw) -> None:
    with progress.bar(3, "work", **kw) as bar:
        bar.update(3)


def test_the_bar_draws_only_on_a_terminal(capsys):
    with terminal() as quiet:
        _run_bar(quiet=True)
    with terminal() as term:
        _run_bar()
    assert quiet.getvalue() == ""
    assert "work: 100%" in term.getvalue() and "3/3" in term.getvalue()
    assert capsys.readouterr() == ("", "")


def test_the_bar_is_off_where_stderr_is_not_a_terminal(capsys):
    _run_bar()
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------- collect
EXECUTOR = SimpleNamespace(counters=SimpleNamespace(compiled=7, compile_failed=1),
                           kernels_left=5)


def _progress() -> Progress:
    prog = Progress(measured=3)
    prog.by_status["ok"] = 3
    return prog


def test_collect_shows_its_counts_in_the_bar_on_a_terminal():
    prog = _progress()
    with terminal() as term, progress.bar(10, "measure", miniters=0) as bar:
        prog.show(bar, 2, 8, EXECUTOR)
    text = term.getvalue()
    assert "2/10" in text and "kernels compiled 7" in text and "status {'ok': 3}" in text
    assert "pending" not in text  # the log line is for logs


def test_collect_logs_its_status_line_every_period_elsewhere(capsys):
    prog = _progress()
    bar = progress.bar(10, "measure")
    prog.show(bar, 2, 8, EXECUTOR)
    prog.show(bar, 1, 7, EXECUTOR)  # within the period: nothing
    prog.last_print -= LOG_EVERY_S
    prog.show(bar, 1, 6, EXECUTOR)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 2
    assert "measured 3" in lines[0] and "pending 8" in lines[0] and "pending 6" in lines[1]
    assert "kernels compiled 7" in lines[1] and "failed 1, left 5" in lines[1]


# ---------------------------------------------------------------- space check
@pytest.fixture
def fake_check(monkeypatch):
    """run_check compiling two configs, the second failing."""
    import cutetune.tuner.measure.space_check as space_check

    def run_check(arch, on_result, **kwargs):
        on_result(1, 2, CompileResult(A, "ok", 2.0))
        on_result(2, 2, CompileResult(B, "error", 1.0, "ptxas says no"))
        times = dict.fromkeys(("compile_s_p50", "compile_s_p90", "compile_s_max", "cpu_s_p50",
                               "projected_minutes_all_kernels_16_cores"), 2.0)
        return {"summary": {"count": 2, "ok": 1, "failed": 1, "configs_per_minute": 1.0, **times},
                "valid_kernels": 1200, "dsl_arch": "sm_90a", "workers": 1, "failures": []}

    monkeypatch.setattr(space_check, "run_check", run_check)


def test_space_check_draws_a_bar_with_failures_above_it(fake_check, capsys):
    with terminal() as term:
        assert main(["space", "check", "--sample", "2"]) == 1
    text = term.getvalue()
    assert "compile: 100%" in text and "2/2" in text and "1 failed" in text
    assert f"[2] {B.short()}: error" in text and "ptxas says no" in text
    assert f"[1] {A.short()}" not in text  # successes only count in the bar
    assert capsys.readouterr().out.startswith("sm90: compiled 2 of 1200 valid kernels")


def test_space_check_logs_a_line_per_config_elsewhere(fake_check, capsys):
    assert main(["space", "check", "--sample", "2"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"[1] {A.short()}", f"[2] {B.short()}"]


def test_space_check_quiet_prints_no_progress(fake_check, capsys):
    with terminal() as term:
        assert main(["space", "check", "--sample", "2", "--quiet"]) == 1
    assert term.getvalue() == ""
    assert capsys.readouterr().out.startswith("sm90: compiled 2")


# ---------------------------------------------------------------- emit
class OneConfigModel:
    def rank(self, problem, configs=None, top_k=None):
        return [(A, 1.0), (B, 2.0)]

    def prefers_cublas(self, problem, configs=None):
        return problem.m < 64


def test_build_reports_each_cell_and_problem_and_builds_the_same_table():
    grid = hz.Grid(m=(1, 64, 1024), n=(64, 4096), k=(64, 4096))
    problems = [GemmProblem(3000, 64, 64), GemmProblem(64, 64, 64, arch="sm100")]
    steps = []
    h = hz.build(OneConfigModel(), "sm90", "bf16", grid=grid, problems=problems,
                 progress=steps.append)
    assert steps == [1] * (grid.size + len(problems))  # the other arch's problem counts too
    plain = hz.build(OneConfigModel(), "sm90", "bf16", grid=grid, problems=problems)
    assert h.to_json() == plain.to_json() and list(h.exact) == [problems[0].key()]
