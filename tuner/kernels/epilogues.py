"""The quack epilogues cutetune fuses into its GEMMs, written with quack's ``@gemm_epilogue``
frontend. Imported only at a kernel's first launch (it imports quack and cutlass, seconds);
quack re-mints a mod's kernel class in its compile workers by importing this module, so each
mod must stay a module-level name here."""

from quack.activation import silu
from quack.epilogue.frontend import gemm_epilogue


@gemm_epilogue()
def silu_mul(acc, c):
    """SwiGLU with the up projection in the accumulator and the gate projection as the GEMM's
    C operand: D = silu(C) * (A @ B), in fp32, rounded once."""
    return {"D": silu(c) * acc}
