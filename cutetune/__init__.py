"""cutetune: an ML-guided autotuner for CuteDSL (quack) GEMM kernels."""

import os as _os

__version__ = "0.1.0"

# In a source checkout the subpackages are the folders beside this one (space/, models/,
# tuner/); an install maps them under cutetune.* through pyproject's package-dir. Extending
# the package path lets `python -m cutetune` and the tests run from the checkout uninstalled,
# as on the GPU host, where only PYTHONPATH can be set.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
        _os.path.join(_root, "space", "__init__.py")):
    __path__.append(_root)
