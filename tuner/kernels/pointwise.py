"""``up = silu(gate) * up`` in one pass over memory, for SwiGLU's unfused path.

Where the fused SwiGLU op runs unfused (a range of a dynamic M that the GPU measured slower
fused, a kernel still being built, a call the kernel cannot take), it has the up product in
``out`` and the gate product beside it. Eager ``out.mul_(F.silu(gate))`` is two kernels that
move 5*M*N elements (silu reads the gate and writes a temporary, the product reads both and
writes ``out``); Inductor's pointwise kernel for the unfused graph moves 3*M*N. On the H200 the
difference cost a dynamic-M MLP 3.8 % of its step at M=1024 (data/bench/step_dynamic_h200.json.gz).
This Triton kernel moves 3*M*N, in fp32 arithmetic with one rounding, as Inductor's does.
Triton compiles it at its first launch in a process (from its disk cache after the first); a
CUDA-graph capture, where nothing should compile, runs eager ATen until it has.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

_BLOCK = 2048
_launched: set[tuple] = set()  # the variants Triton compiled in this process (``_variant``)


@lru_cache(maxsize=None)
def _kernel():
    """The Triton kernel, defined on first use: importing triton costs a process that runs
    only quack or ATen paths nothing."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_inplace(up_ptr, gate_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(gate_ptr + offs, mask=mask).to(tl.float32)
        u = tl.load(up_ptr + offs, mask=mask).to(tl.float32)
        tl.store(up_ptr + offs, (g * tl.sigmoid(g) * u).to(up_ptr.dtype.element_ty), mask=mask)

    return silu_mul_inplace


def one_pass(up: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether the Triton kernel takes these operands: CUDA tensors of one shape, dtype and
    device, both contiguous (the products of an mm are)."""
    return (up.is_cuda and gate.device == up.device and gate.dtype == up.dtype
            and gate.shape == up.shape and up.is_contiguous() and gate.is_contiguous())


def _variant(up: torch.Tensor, gate: torch.Tensor, n: int) -> tuple:
    """What Triton compiles the kernel for: the dtype, and which arguments it specializes on
    (pointers 16-byte aligned, an int divisible by 16 or equal to 1)."""
    return (up.dtype, up.data_ptr() % 16 == 0, gate.data_ptr() % 16 == 0, n % 16 == 0, n == 1)


def silu_mul_(up: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``up = silu(gate) * up`` in place; eager ATen where the kernel does not take the
    operands (``one_pass``)."""
    if not one_pass(up, gate):
        return up.mul_(F.silu(gate))
    n = up.numel()
    variant = _variant(up, gate, n)
    if variant not in _launched and torch.cuda.is_current_stream_capturing():
        return up.mul_(F.silu(gate))
    if n:
        with torch.cuda.device(up.device):
            _kernel()[(-(-n // _BLOCK),)](up, gate, n, BLOCK=_BLOCK, num_warps=8)
        _launched.add(variant)
    return up
