"""The one conversion from what PyTorch holds (tensors, fake tensors, FX nodes, Inductor IR
nodes) to a ``GemmProblem``, with quack's support envelope: dtype, majors, 16-byte TMA strides,
the addend's shape. Every check is a pure function of sizes and strides, shared by compile-time
decisions and run-time calls; a base pointer's alignment is only known at run time and is
checked on every call (``launcher``)."""

from __future__ import annotations

import dataclasses
import operator
from functools import lru_cache
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ...space.config import KernelConfig
from ...space.problem import TMA_ALIGN_BYTES, GemmProblem, GroupedProblem, ProblemError
from ...space.rules import violations

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
TORCH_DTYPE_OF = {name: dtype for dtype, name in TORCH_DTYPES.items()}
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CAPABILITY_ARCH = {9: "sm90", 10: "sm100"}


@lru_cache(maxsize=None)
def device_arch(device: torch.device) -> str | None:
    """'sm90' / 'sm100' for a CUDA device quack's GEMM supports, else None."""
    if device.type != "cuda":
        return None
    return CAPABILITY_ARCH.get(torch.cuda.get_device_capability(device)[0])


def cuda_device_name() -> str | None:
    """The current CUDA device's name as torch gives it, None without CUDA (on a host of
    mixed GPUs, the current one's, not necessarily that of a compiled graph's tensors)."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _major(size, stride, dims: tuple[str, str], elem: int, operand: str) -> str:
    """Which of the last two dims is contiguous; the other's stride must be TMA-aligned."""
    align = TMA_ALIGN_BYTES // elem
    if stride[-1] == 1 and stride[-2] % align == 0:
        return dims[1]
    if stride[-2] == 1 and stride[-1] % align == 0:
        return dims[0]
    raise ProblemError(f"{operand} with sizes {tuple(size)} and strides {tuple(stride)} has no "
                       f"contiguous dim with a {TMA_ALIGN_BYTES}-byte aligned leading stride")


def gemm_problem(a_size, a_stride, b_size, b_stride, dtype: torch.dtype, out_dtype: torch.dtype,
                 arch: str | None) -> GemmProblem:
    """The GemmProblem of ``A @ B`` for operands of these sizes and strides (2D mm or 3D bmm),
    or ProblemError naming why quack cannot run it."""
    if arch is None:
        raise ProblemError("the device is not an sm90 or sm100 GPU")
    if dtype not in TORCH_DTYPES or out_dtype != dtype:
        raise ProblemError(f"dtype {dtype} -> {out_dtype} is not supported; quack runs "
                           f"bf16 or fp16 with the same output dtype")
    if len(a_size) != len(b_size) or len(a_size) not in (2, 3):
        raise ProblemError(f"expected 2D or 3D operands, got {len(a_size)}D @ {len(b_size)}D")
    (m, k), (k2, n) = a_size[-2:], b_size[-2:]
    batch = a_size[0] if len(a_size) == 3 else 1
    if k != k2 or (len(b_size) == 3 and b_size[0] != batch):
        raise ProblemError(f"sizes {tuple(a_size)} @ {tuple(b_size)} do not multiply")
    elem = dtype.itemsize
    a_major = _major(a_size, a_stride, ("m", "k"), elem, "A")
    b_major = _major(b_size, b_stride, ("k", "n"), elem, "B")
    if batch > 1 and (a_stride[0] * elem % TMA_ALIGN_BYTES or b_stride[0] * elem % TMA_ALIGN_BYTES):
        raise ProblemError(f"batch strides {a_stride[0]}, {b_stride[0]} are not "
                           f"{TMA_ALIGN_BYTES}-byte aligned")
    name = TORCH_DTYPES[dtype]
    return GemmProblem(m=int(m), n=int(n), k=int(k), batch=int(batch), dtype=name, out_dtype=name,
                       a_major=a_major, b_major=b_major, arch=arch)


def grouped_problem(a_size, a_stride, b_size, b_stride, groups: int, dtype: torch.dtype,
                    out_dtype: torch.dtype, arch: str | None) -> GroupedProblem:
    """The GroupedProblem of ``torch._grouped_mm(A, B, offs)`` with ``groups`` offsets, for
    operands of these sizes and strides, or ProblemError naming why quack's varlen kernels
    cannot run it. Their forms are the MoE layer's: 2D x 3D, A (M_total, K) row-major with
    B (E, K, N) K-major (the forward, W[e]^T) or N-major (the input gradient, W[e]); 2D x 2D,
    A (M, K_total) M-major and B (K_total, N) row-major into (E, M, N) (the weight gradient)."""
    if arch is None:
        raise ProblemError("the device is not an sm90 or sm100 GPU")
    if dtype not in TORCH_DTYPES or out_dtype != dtype:
        raise ProblemError(f"dtype {dtype} -> {out_dtype} is not supported; quack runs "
                           f"bf16 or fp16 with the same output dtype")
    elem, name = dtype.itemsize, TORCH_DTYPES[dtype]
    if len(a_size) == 2 and len(b_size) == 3:
        (m, k), (e, k2, n) = a_size, b_size
        if k != k2 or e != groups:
            raise ProblemError(f"sizes {tuple(a_size)} @ {tuple(b_size)} with {groups} "
                               f"offsets do not multiply")
        if _major(a_size, a_stride, ("m", "k"), elem, "A") != "k":
            raise ProblemError("A of a varlen-M grouped GEMM must be row-major (K contiguous)")
        gemm = {"k": "fwd", "n": "dgrad"}[_major(b_size, b_stride, ("k", "n"), elem, "B")]
        if e > 1 and b_stride[0] * elem % TMA_ALIGN_BYTES:
            raise ProblemError(f"B's expert stride {b_stride[0]} is not {TMA_ALIGN_BYTES}-byte "
                               f"aligned")
    elif len(a_size) == 2 and len(b_size) == 2:
        (m, k), (k2, n), e, gemm = a_size, b_size, groups, "wgrad"
        if k != k2:
            raise ProblemError(f"sizes {tuple(a_size)} @ {tuple(b_size)} do not multiply")
        if (_major(a_size, a_stride, ("m", "k"), elem, "A"),
                _major(b_size, b_stride, ("k", "n"), elem, "B")) != ("m", "n"):
            raise ProblemError("a varlen-K grouped GEMM takes A M-major and B row-major "
                               "(the weight gradient's dY^T @ X)")
    else:
        raise ProblemError(f"quack's grouped GEMMs take 2D x 3D (varlen M) or 2D x 2D "
                           f"(varlen K) operands, got {len(a_size)}D x {len(b_size)}D")
    return GroupedProblem(int(e), int(m), int(n), int(k), gemm=gemm, dtype=name, out_dtype=name,
                          arch=arch)


def static_ints(values, what: str) -> tuple[int, ...]:
    """``values`` (sizes or strides, as Inductor or fake tensors hold them) as ints, or
    ProblemError when one is symbolic."""
    out = []
    for v in values:
        if getattr(v, "is_Integer", False):  # a sympy integer, told without importing sympy
            v = int(v)
        if not isinstance(v, int):
            raise ProblemError(f"{what} {tuple(values)} are symbolic")
        out.append(v)
    return tuple(out)


def static_gemm_problem(a_size, a_stride, b_size, b_stride, dtype: torch.dtype,
                        out_dtype: torch.dtype, arch: str | None) -> GemmProblem:
    """``gemm_problem`` for sizes and strides that must be static integers."""
    return gemm_problem(
        static_ints(a_size, "A sizes"), static_ints(a_stride, "A strides"),
        static_ints(b_size, "B sizes"), static_ints(b_stride, "B strides"), dtype, out_dtype,
        arch)


def check_out(size, stride, dtype: torch.dtype) -> None:
    """quack writes D row-major (N contiguous) with TMA-aligned row and batch strides."""
    align = TMA_ALIGN_BYTES // dtype.itemsize
    batch_misaligned = len(size) == 3 and size[0] > 1 and stride[0] % align
    if stride[-1] != 1 or stride[-2] % align or batch_misaligned:
        raise ProblemError(f"output strides {tuple(stride)} are not row-major with "
                           f"{TMA_ALIGN_BYTES}-byte aligned leading strides")


def addend_kind(size, stride, dtype: torch.dtype, out_dtype: torch.dtype, m: int, n: int,
                beta: float) -> str | None:
    """How addmm's ``input`` maps onto quack's epilogue D = alpha*AB + beta*C + bias:
    None (beta == 0: the input is ignored), "bias" (a row broadcast along M; quack adds it
    unscaled, so only with beta == 1) or "c" (a full row-major (M, N) tensor)."""
    if beta == 0:
        return None
    align = TMA_ALIGN_BYTES // dtype.itemsize
    row = size[-1] == n and stride[-1] == 1
    if row and (len(size) == 1 or (len(size) == 2 and (size[0] == 1 or stride[0] == 0))):
        if beta != 1:
            raise ProblemError(f"a broadcast bias with beta={beta} (quack adds bias unscaled)")
        if dtype not in BIAS_DTYPES or (n * dtype.itemsize) % TMA_ALIGN_BYTES:
            raise ProblemError(f"bias of dtype {dtype} and length {n} is not supported")
        return "bias"
    if row and len(size) == 2 and size[0] == m and stride[0] % align == 0:
        if dtype != out_dtype:
            raise ProblemError(f"C dtype {dtype} differs from the output dtype {out_dtype}")
        return "c"
    raise ProblemError(f"addmm input of sizes {tuple(size)} and strides {tuple(stride)} is neither "
                       f"a row bias nor a row-major (M, N) tensor")


def as_config(config) -> KernelConfig:
    """A KernelConfig from itself or from its field tuple (how generated code passes it)."""
    return config if isinstance(config, KernelConfig) else KernelConfig(*config)


def config_tuple(config: KernelConfig) -> tuple:
    """The field tuple generated code carries: a plain literal, so the code imports nothing."""
    return dataclasses.astuple(config)


_FIELDS = tuple(f.name for f in dataclasses.fields(KernelConfig))


def config_ints(config: KernelConfig) -> list[int]:
    """A config as the int list a custom op's schema carries."""
    return [int(v) for v in config_tuple(config)]


def config_from_ints(config) -> KernelConfig:
    return KernelConfig.from_dict(dict(zip(_FIELDS, config)))


def table_ints(table) -> list[int]:
    """A table of configs by range of M (``launcher.m_ranges``; None: ATen) as the int list a
    custom op's schema carries: per range its largest M and the config's ints, zeros for None
    (no config has a zero tile)."""
    return [int(v) for m_max, c in table
            for v in (m_max, *(config_ints(c) if c is not None else [0] * len(_FIELDS)))]


_tables: dict[tuple[int, ...], tuple] = {}  # table_ints -> ranges: parsed once per process


def parsed_table(table) -> tuple:
    """``table_ints``'s ranges back, ``((largest M, config or None), ...)``."""
    key = tuple(table)
    ranges = _tables.get(key)
    if ranges is None:
        width = 1 + len(_FIELDS)
        rows = (key[i:i + width] for i in range(0, len(key), width))
        ranges = _tables[key] = tuple((r[0], config_from_ints(r[1:]) if r[1] else None)
                                      for r in rows)
    return ranges


def check_config(config: KernelConfig, arch: str, problem: GemmProblem) -> None:
    """ProblemError naming the validity rules ``config`` breaks for ``problem``, if any."""
    bad = violations(config, arch, problem)
    if bad:
        raise ProblemError(f"config {config.short()} breaks rule(s) "
                           f"{', '.join(r.name for r in bad)} on {arch}")


# ---------------------------------------------------------------- tensors at run time
def call_problem(a, b, out, config: KernelConfig, c, beta) -> tuple[GemmProblem, str | None]:
    """The GemmProblem of a ``quack_mm_out`` call and its addend's kind (``addend_kind``; None
    without one), or ProblemError naming why quack cannot run it (from metadata: base
    pointers are checked on each call)."""
    arch = device_arch(a.device)
    if b.device != a.device or out.device != a.device:
        raise ProblemError("operands are on different devices")
    problem = gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype, out.dtype, arch)
    check_out(out.shape, out.stride(), out.dtype)
    addend = None
    if c is not None:
        if a.dim() != 2:
            raise ProblemError("an addend is for addmm (2D operands) only")
        addend = addend_kind(c.shape, c.stride(), c.dtype, out.dtype, problem.m, problem.n, beta)
    check_config(config, arch, problem)
    return problem, addend


def grouped_call_problem(a, b, offs) -> GroupedProblem:
    """The GroupedProblem of a ``grouped_mm`` call (from metadata: base pointers are checked
    on each call), or ProblemError naming why quack cannot run it."""
    if b.device != a.device or offs.device != a.device:
        raise ProblemError("operands are on different devices")
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise ProblemError(f"offs must be a 1D int32 tensor, got {offs.dim()}D {offs.dtype}")
    if b.dtype != a.dtype:
        raise ProblemError(f"A is {a.dtype} and B {b.dtype}; quack takes one dtype for both")
    return grouped_problem(a.shape, a.stride(), b.shape, b.stride(), offs.shape[0], a.dtype,
                           a.dtype, device_arch(a.device))


def fused_call_problem(a, b, gate, out, config: KernelConfig) -> GemmProblem:
    """The up projection's GEMM problem; ProblemError where the fused kernel cannot run it."""
    arch = device_arch(a.device)
    if any(t.device != a.device for t in (b, gate, out)):
        raise ProblemError("operands are on different devices")
    if a.dim() != 2:
        raise ProblemError("the fused SwiGLU GEMM is for 2D operands only")
    problem = gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype, out.dtype, arch)
    for name, t in (("out", out), ("gate", gate)):
        if tuple(t.shape) != (problem.m, problem.n) or t.dtype != out.dtype:
            raise ProblemError(f"{name} is {tuple(t.shape)} {t.dtype}, expected "
                               f"{(problem.m, problem.n)} {out.dtype}")
        check_out(t.shape, t.stride(), t.dtype)
    if config.split_k != 1:
        raise ProblemError("split-K would apply silu to partial sums")
    check_config(config, arch, problem)
    return problem


# ---------------------------------------------------------------- graphs at compile time
def operand_problem(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, arch: str | None
                    ) -> GemmProblem | None:
    """The GemmProblem of a mm/bmm of these (fake) operands, None where quack cannot run it or
    it is a bmm of one batch (which runs a batched kernel: its problem would read as a
    mm's)."""
    if a.dim() == 3 and a.shape[0] == 1:
        return None
    try:
        return static_gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype,
                                            out.dtype, arch)
    except ProblemError:
        return None


def fx_problem(x, w, arch: Callable[[torch.device], str | None], m: int | None = None
             ) -> GemmProblem:
    """The up projection's problem, with its M set to ``m`` if given (M dynamic), or
    ProblemError naming why quack cannot run it."""
    a, b = x.meta.get("val"), w.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (a, b)):
        raise ProblemError("operands without fake-tensor metadata")
    a_size = list(a.shape)
    if m is not None:
        a_size[0] = m
    return static_gemm_problem(a_size, a.stride(), b.shape, b.stride(), a.dtype,
                                        a.dtype, arch(a.device))


def node_problem(mat1, mat2, out_dtype: torch.dtype, arch: str | None,
                  m: int | None = None) -> GemmProblem:
    for node, name in ((mat1, "A"), (mat2, "B")):
        offset = static_ints([node.get_layout().offset], f"{name} offset")[0]
        if offset * node.get_dtype().itemsize % TMA_ALIGN_BYTES:
            raise ProblemError(f"{name} starts {offset} elements into its buffer (unaligned)")
    a_size = list(mat1.get_size())
    if m is not None:
        a_size[-2] = m
    return static_gemm_problem(a_size, mat1.get_stride(), mat2.get_size(),
                                        mat2.get_stride(), mat1.get_dtype(), out_dtype, arch)


def problem_from_inputs(op_name: str, kernel_inputs, arch: str | None,
                        m: int | None = None) -> GemmProblem:
    """The GemmProblem of an Inductor mm/addmm/bmm node (its MMKernelInputs), with its M set
    to ``m`` if given (a node whose M is dynamic), or ProblemError naming why quack cannot
    run it."""
    mat1, mat2 = kernel_inputs.mat1mat2()
    problem = node_problem(mat1, mat2, kernel_inputs.out_dtype(), arch, m)
    if op_name == "addmm":
        inp = kernel_inputs.nodes()[0]
        addend_kind(static_ints(inp.get_size(), "input sizes"),
                             static_ints(inp.get_stride(), "input strides"),
                             inp.get_dtype(), kernel_inputs.out_dtype(), problem.m, problem.n,
                             kernel_inputs.get_scalar("beta"))
    return problem


# Nodes whose kernels the prefetcher builds: plain GEMMs. addmm's epilogue (bias or C) makes
# other kernels, which compile on first use as before.
PREFETCH_TARGETS = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)


def graph_gemms(graph: torch.fx.Graph, arch: str | None) -> list[GemmProblem]:
    """The GemmProblems of a graph's mm/bmm nodes that quack can run, one per node, read from
    their inputs' fake-tensor metadata (the layouts lowering will see, barring a layout
    Inductor changes)."""
    problems = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in PREFETCH_TARGETS:
            continue
        a, b = (getattr(x, "meta", {}).get("val") for x in node.args[:2])
        out = node.meta.get("val")
        if all(isinstance(t, torch.Tensor) for t in (a, b, out)):
            problems.append(operand_problem(a, b, out, arch))
    return [p for p in problems if p is not None]


def graph_problems(graph: torch.fx.Graph, arch: str | None) -> list[GemmProblem]:
    """The distinct ``graph_gemms`` (a kernel prefetched for a layout Inductor then changes
    goes unused)."""
    return list(dict.fromkeys(graph_gemms(graph, arch)))


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
