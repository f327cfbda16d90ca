"""cutetune: an ML-guided autotuner for CuteDSL (quack) GEMM kernels."""

import os as _os

from .version import __version__

# In a source checkout the subpackages are the folders beside this one (space/, models/,
# tuner/); an install maps them under cutetune.* through pyproject's package-dir. Extending
# the package path lets `python -m cutetune` and the tests run from the checkout uninstalled,
# as on the GPU host, where only PYTHONPATH can be set.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
        _os.path.join(_root, "space", "__init__.py")):
    __path__.append(_root)


def enable(mode: str = "predicted", **options):
    """``cutetune.tuner.inductor.enable`` (same arguments, same Installation), entered without
    importing Inductor first: in reduced mode the compile helper is forked before that import,
    so the helper's own imports (cutlass and quack) run beside Inductor's instead of after
    them. On the H200 host a cold MLP's first benchmark then waited 1.67-2.87 s for the helper,
    against 3.21-4.10 s entered through ``cutetune.tuner.inductor``
    (data/bench/e2e_h200_1gpu_early*.json.gz, _late*.json.gz)."""
    from . import settings

    if settings.parse_mode(mode) == "reduced" and options.get("prefetch", True) is True:
        _start_compile_helper()
    from .tuner.inductor.install import enable as enable_inductor

    return enable_inductor(mode, **options)


def enable_from_env(environ=None):
    """``cutetune.tuner.inductor.enable_from_env``, entered as ``enable`` is."""
    from . import settings

    if settings.compile_mode(environ) == "reduced":
        _start_compile_helper()
    from .tuner.inductor.install import enable_from_env as enable_inductor_from_env

    return enable_inductor_from_env(environ)


def __getattr__(name: str):
    """``cutetune.grouped_mm`` (``tuner/kernels/grouped_mm.py``), imported on first use: it
    imports torch, which ``cutetune --help`` must not."""
    if name == "grouped_mm":
        from .tuner.kernels.grouped_mm import grouped_mm

        globals()[name] = grouped_mm
        return grouped_mm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _start_compile_helper() -> None:
    from .tuner.kernels.helper import start_for_this_gpu

    start_for_this_gpu()
