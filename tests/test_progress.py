"""Progress of the long commands: a tqdm bar on stderr when it is a terminal; elsewhere (logs,
pipes, CI) no bar, with collect's status line printed as plain lines instead; stdout keeps
only results."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from types import SimpleNamespace

from cutetune import progress
from cutetune.tuner.measure.collect import LOG_EVERY_S, Progress


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
