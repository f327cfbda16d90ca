"""The search space: GEMM problems, quack kernel configs, validity rules, devices and features."""

from .config import KernelConfig, quack_default_config
from .enumerate import AXES, compile_keys, enumerate_configs, sample_configs
from .problem import GemmProblem, GroupedProblem, ProblemError
from .rules import CONFIG_RULES, PROBLEM_RULES, is_valid, violations

__all__ = [
    "AXES", "CONFIG_RULES", "PROBLEM_RULES", "GemmProblem", "GroupedProblem", "KernelConfig",
    "ProblemError",
    "compile_keys", "enumerate_configs", "is_valid", "quack_default_config", "sample_configs",
    "violations",
]
