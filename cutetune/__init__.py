"""cutetune: an ML-guided autotuner for CuteDSL (quack) GEMM kernels."""
__version__ = "0.1.0"
