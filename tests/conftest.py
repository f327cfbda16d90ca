"""Fixtures every test file shares: a cutetune cache folder of each test's own (libraries,
templates, kernels), so none reads what another built nor fills the user's ~/.cache; and
``run_script``, for what must run in a fresh interpreter."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parent.parent)


@pytest.fixture(autouse=True)
def _own_cutetune_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path_factory.mktemp("cutetune-cache")))


@pytest.fixture(autouse=True)
def _no_compile_variables(monkeypatch):
    """enable() takes an argument left out from its variable: a developer's or the GPU host's
    CUTETUNE_TOPK, _FEEDBACK, ... must not steer the tests."""
    from cutetune.settings import COMPILE_VARIABLES

    for name in ("CUTETUNE_MODE", *COMPILE_VARIABLES.values()):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def run_script(tmp_path_factory):
    """``run(source, *args, env=None, drop=(), timeout=600)``: run the Python ``source`` as a
    script in a fresh interpreter with ``args`` (checkout first on its path; this process's
    environment less the names in ``drop``, with ``env`` over it), fail the test with its
    stderr if it exits non-zero, and return the JSON of its last line of output."""
    folder, count = tmp_path_factory.mktemp("scripts"), itertools.count()

    def run(source: str, *args, env: dict | None = None, drop=(), timeout: float = 600):
        script = folder / f"script{next(count)}.py"
        script.write_text(source)
        full = {k: v for k, v in os.environ.items() if k not in drop}
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        full.update(env or {})
        res = subprocess.run([sys.executable, str(script), *map(str, args)], env=full,
                             capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture
def read_only_dir() -> str:
    """A folder no one can write in, root included (/sys/kernel on Linux); skips elsewhere."""
    folder = "/sys/kernel"
    probe = os.path.join(folder, f".cutetune-probe-{os.getpid()}")
    try:
        open(probe, "w").close()
    except OSError:
        return folder
    os.unlink(probe)
    pytest.skip(f"{folder} is writable here")
