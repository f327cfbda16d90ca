"""Every setting cutetune reads from the environment, in one place.

Values are read when asked for, not at import: tests and users may set them at any time before
the call that needs them. The README's settings table lists the same variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .errors import OutputError

MODES = ("predicted", "reduced", "off")
PACKAGE_DATA = Path(__file__).resolve().parent / "data"  # the shipped artifacts (pyproject)


def model_file_name(arch: str, dtype: str, kind: str = "dense") -> str:
    """The file name of a packaged cost model of ``kind`` problems on ``arch``/``dtype``
    (gzipped: three quarters of the bytes of the JSON's base64 boosters); ``*`` globs."""
    return f"cost_model_{arch}_{dtype}{'' if kind == 'dense' else '_' + kind}.json.gz"


# variable -> (default, meaning); the README's table is written from this
VARIABLES = {
    "CUTETUNE_MODE": ("off", "torch.compile mode installed by enable_from_env(): predicted, "
                             "reduced or off (case-insensitive)"),
    "CUTETUNE_TOPK": ("5", "reduced mode: quack configs benchmarked per GEMM"),
    "CUTETUNE_MODEL": ("the packaged heuristics", "heuristics file for torch.compile"),
    "CUTETUNE_GROUPED_MODEL": ("the packaged grouped model",
                               "grouped (MoE) cost model for cutetune.grouped_mm and compile"),
    "CUTETUNE_FEEDBACK": ("none", "reduced mode: dataset folder receiving Inductor's timings"),
    "CUTETUNE_FUSE_SWIGLU": ("1", "fuse silu(gate) * up into one quack GEMM where measured faster"),
    "CUTETUNE_TUNE_GEMV": ("1", "under CUDA graphs, tune a one-row GEMM's fused reductions as "
                                "max-autotune does (seconds of compile)"),
    "CUTETUNE_CACHE": ("$XDG_CACHE_HOME/cutetune or ~/.cache/cutetune", "cutetune's cache folder"),
    "CUTETUNE_TEMPLATE_CACHE_DIR": ("<cache>/triton-templates",
                                    "Triton template kernels kept across processes"),
    "CUTETUNE_FUSED_KERNELS": ("the packaged fused_kernels.zip",
                               "prebuilt fused-kernel objects (cutetune prebuild --package)"),
    "QUACK_CACHE_DIR": ("<cache>/quack-kernels (the tuner)", "quack's on-disk kernel cache"),
    "QUACK_CACHE_ENABLED": ("1", "0: quack keeps no disk cache (the compile helper then idles)"),
}


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def parse_mode(text: str, variable: str | None = None) -> str:
    """One rule for mode names, for ``enable(mode=...)`` and CUTETUNE_MODE alike: any case,
    surrounding spaces ignored."""
    mode = str(text).strip().lower()
    if mode not in MODES:
        where = f"{variable}={text!r}" if variable else f"unknown cutetune mode {text!r}"
        raise ValueError(f"{where}; expected one of {', '.join(MODES)}")
    return mode


# enable()'s arguments, each with the variable that stands in for it when left None
COMPILE_VARIABLES = {"top_k": "CUTETUNE_TOPK", "model": "CUTETUNE_MODEL",
                     "feedback": "CUTETUNE_FEEDBACK", "fuse_swiglu": "CUTETUNE_FUSE_SWIGLU",
                     "tune_gemv": "CUTETUNE_TUNE_GEMV"}


def compile_mode(environ: Mapping[str, str] | None = None) -> str:
    """CUTETUNE_MODE: the mode ``enable_from_env()`` installs ("off" when unset)."""
    raw = _env(environ).get("CUTETUNE_MODE", "").strip()
    return parse_mode(raw, "CUTETUNE_MODE") if raw else "off"


def compile_setting(argument: str, environ: Mapping[str, str] | None = None):
    """``enable()``'s ``argument`` from its variable (``COMPILE_VARIABLES``), checked; read
    only when asked, so that a bad variable fails only where it would be used."""
    env, name = _env(environ), COMPILE_VARIABLES[argument]
    if argument in ("fuse_swiglu", "tune_gemv"):
        return _switch(env, name)
    if argument != "top_k":
        return env.get(name) or None
    if not env.get(name, "").strip():
        return None
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not an integer") from None


def _switch(env: Mapping[str, str], name: str) -> bool:
    """A 0/1 variable, unset or empty meaning 1."""
    value = env.get(name, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{name}={env[name]!r}; expected 0 or 1")
    return value == "1"


def cache_dir() -> Path:
    """cutetune's cache folder: $CUTETUNE_CACHE, else cutetune under $XDG_CACHE_HOME or ~/.cache."""
    base = os.environ.get("CUTETUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cutetune")
    return Path(base)


def quack_cache_dir() -> str | None:
    """$QUACK_CACHE_DIR, the folder quack itself reads; None where unset."""
    return os.environ.get("QUACK_CACHE_DIR") or None


def quack_cache_enabled() -> bool:
    return os.environ.get("QUACK_CACHE_ENABLED", "1") == "1"


def kernel_cache_dir(explicit: str | None = None) -> str:
    """quack's on-disk kernel cache for the tuner: ``explicit``, else $QUACK_CACHE_DIR, else
    ``quack-kernels`` in cutetune's cache folder (``cache_dir``)."""
    path = explicit or quack_cache_dir() or str(cache_dir() / "quack-kernels")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:  # a file there, or no permission: named, not a traceback
        raise OutputError(f"kernel cache folder {path} cannot be used ({e.strerror}); give a "
                          f"folder (--cache-dir, $QUACK_CACHE_DIR or $CUTETUNE_CACHE)") from None
    return path


def template_cache_dir() -> Path:
    """$CUTETUNE_TEMPLATE_CACHE_DIR, else triton-templates in cutetune's cache folder."""
    return Path(os.environ.get("CUTETUNE_TEMPLATE_CACHE_DIR") or cache_dir() / "triton-templates")


def grouped_model() -> str | None:
    """$CUTETUNE_GROUPED_MODEL: the grouped cost model's file (None: the packaged one)."""
    return os.environ.get("CUTETUNE_GROUPED_MODEL") or None


def fused_kernels_package() -> str | None:
    """$CUTETUNE_FUSED_KERNELS as set (None: unset; empty: no package)."""
    return os.environ.get("CUTETUNE_FUSED_KERNELS")
