"""Cost models: learn kernel time from measurements, rank configs, decide the ATen fallback
(cuBLAS; torch._grouped_mm for grouped GEMMs), one model per kind of problem (``kinds``).

The names below load on first use: compile-time code imports light submodules
(``models.triton_mm``) without paying for the learners' imports."""

from importlib import import_module

# (the predict function is cutetune.models.predict.predict: its module's name would shadow it)
_EXPORTS = {"CostModel": "artifact", "ModelError": "artifact", "load_model": "artifact",
            "shipped_model_path": "artifact"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
