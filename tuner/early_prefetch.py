"""Reduced mode's kernels sent to the compile helper from Dynamo's graph, before AOTAutograd.

The prefetcher (``prefetch.py``) gets a graph's top-k kernels when Inductor lowers its first
GEMM node, after AOTAutograd has traced, decomposed and partitioned the graph: seconds into a
fresh process's first compile, which its benchmark then waits out for the helper's compiles.
Dynamo's graph already holds the GEMMs (``linear``, ``matmul``, ``mm``, ``bmm`` calls with
fake-tensor values), so a pre-grad pass can read their problems as Inductor will see them
and send the kernels then. What it reads wrong (a layout lowering changes) costs a kernel
built for nothing; what it misses is sent at lowering as before.
"""

from __future__ import annotations

import logging
import operator
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from cutetune.space.problem import GemmProblem, ProblemError

from . import launcher
from .graph_pass import ChainedPass

log = logging.getLogger(__name__)

# Dynamo's targets for a product of two matrices whose operands reach Inductor's mm/bmm as
# they are, and whether a first operand of more dimensions has its leading ones folded into M
# (matmul's decomposition, also linear's)
PRODUCTS = {torch.mm: False, torch.bmm: False, torch.matmul: True, operator.matmul: True}
METHODS = {"mm": False, "bmm": False, "matmul": True, "__matmul__": True}


def _value(arg) -> torch.Tensor | None:
    """A node's fake tensor where it has static sizes and strides: an op on symbolic ones
    could add guards to Dynamo's shape environment, and such a GEMM has no static problem
    anyway; a tensor subclass (DTensor, say) is left to lowering too."""
    value = getattr(arg, "meta", {}).get("example_value")
    if type(value) is not FakeTensor:
        return None
    static = all(type(d) is int for d in (*value.shape, *value.stride()))
    return value if static else None


def _operands(node: torch.fx.Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fake A and B of the mm/bmm that ``node`` decomposes into, None where it is none (a
    linear with a bias is an addmm, whose epilogue makes other kernels, and a product of
    vectors or of batches that broadcast is left to lowering)."""
    if node.op == "call_function" and node.target is torch._C._nn.linear:
        x, w = (_value(a) for a in node.args[:2])
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        if x is None or w is None or bias is not None or w.dim() != 2:
            return None
        a, b, folded = x, w.t(), True  # linear without a bias is matmul(x, w.t())
    elif node.op == "call_function" and node.target in PRODUCTS:
        (a, b), folded = (_value(x) for x in node.args[:2]), PRODUCTS[node.target]
    elif node.op == "call_method" and node.target in METHODS:
        (a, b), folded = (_value(x) for x in node.args[:2]), METHODS[node.target]
    else:
        return None
    if a is None or b is None:
        return None
    if folded and b.dim() == 2 and a.dim() >= 3:
        try:  # matmul folds into a mm where that is a view (else a bmm or a copy: left)
            return a.view(-1, a.shape[-1]), b
        except (RuntimeError, ValueError):  # a fake tensor's view raises the latter
            return None
    if a.dim() == b.dim() and a.dim() in (2, 3) and a.shape[:-2] == b.shape[:-2]:
        return a, b
    return None


def operand_problem(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, arch: str | None
                    ) -> GemmProblem | None:
    """The GemmProblem of a mm/bmm of these (fake) operands, None where quack cannot run it or
    it is a bmm of one batch (which runs a batched kernel: its problem would read as a
    mm's)."""
    if a.dim() == 3 and a.shape[0] == 1:
        return None
    try:
        return launcher.static_gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype,
                                            out.dtype, arch)
    except ProblemError:
        return None


def dynamo_gemms(graph: torch.fx.Graph, arch: Callable[[torch.device], str | None]
                 ) -> list[GemmProblem]:
    """The distinct GemmProblems of a Dynamo graph's mm/bmm-to-be that quack can run, with
    the layouts their decompositions give the operands (``operand_problem``)."""
    problems = []
    for node in graph.nodes:
        operands, out = _operands(node), _value(node)
        if operands is not None and out is not None:
            problems.append(operand_problem(*operands, out, arch(operands[0].device)))
    return list(dict.fromkeys(p for p in problems if p is not None))


class EarlyPrefetchPass(ChainedPass):
    """A pre-grad pass that hands ``send`` the problems of ``dynamo_gemms`` and leaves the
    graph as it is. A failure is logged and costs compile time only."""

    NAME = "cutetune-early-prefetch"

    def __init__(self, send: Callable[[list[GemmProblem]], None], key: str,
                 arch: Callable[[torch.device], str | None],
                 user_pass: Callable[[torch.fx.Graph], None] | None = None) -> None:
        super().__init__(key, user_pass)
        self.send, self.arch = send, arch

    def apply(self, graph: torch.fx.Graph) -> None:
        try:
            problems = dynamo_gemms(graph, self.arch)
            if problems:
                self.send(problems)
        except Exception as e:  # noqa: BLE001
            log.warning("cutetune: early kernel prefetch failed (%s: %s); kernels are sent "
                        "at lowering", type(e).__name__, e)
