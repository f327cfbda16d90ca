"""A GEMM problem: D[b] = A[b] @ B[b], what one Inductor mm/addmm/bmm node asks for.

Majors follow quack's naming: A is (M, K) and is "k"-major when K is contiguous (row-major)
or "m"-major when M is; B is (K, N) and is "k"-major when K is contiguous (the transposed
weight of ``nn.Linear``) or "n"-major when N is. D is always row-major (N contiguous).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .device import largest_memory

ARCHES = ("sm90", "sm100")
# Element width in bytes of each dtype we accept by name.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8_e4m3": 1, "fp32": 4}
SUPPORTED_DTYPES = ("bf16", "fp16")
TMA_ALIGN_BYTES = 16


class ProblemError(ValueError):
    """A user-facing mistake in a problem description (bad size, dtype, arch or alignment)."""


@dataclass(frozen=True)
class GemmProblem:
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "bf16"  # A and B
    out_dtype: str = "bf16"
    a_major: str = "k"
    b_major: str = "k"
    arch: str = "sm90"

    def __post_init__(self) -> None:
        validate_problem(self)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def min_bytes(self) -> int:
        """Bytes a GEMM must move at least: each operand read once, D written once."""
        e, o = DTYPE_BYTES[self.dtype], DTYPE_BYTES[self.out_dtype]
        return self.batch * ((self.m * self.k + self.k * self.n) * e + self.m * self.n * o)

    def to_dict(self) -> dict:
        return asdict(self)

    def key(self) -> str:
        """Stable text key, used to group dataset rows by problem."""
        return (
            f"{self.arch}:{self.dtype}->{self.out_dtype}:{self.a_major}{self.b_major}:"
            f"b{self.batch}:m{self.m}:n{self.n}:k{self.k}"
        )

    @classmethod
    def from_key(cls, key: str) -> GemmProblem:
        """The problem whose ``key()`` is ``key``; ProblemError for other text."""
        parts = key.split(":")
        try:
            arch, dtypes, majors, *dims = parts
            dtype, out_dtype = dtypes.split("->")
            sizes = {d[0]: int(d[1:]) for d in dims}
            if [d[0] for d in dims] != list("bmnk") or len(majors) != 2:
                raise ValueError(key)
        except ValueError:
            raise ProblemError(f"{key!r} is not a problem key "
                               f"(like sm90:bf16->bf16:kk:b1:m4096:n14336:k4096)") from None
        return cls(m=sizes["m"], n=sizes["n"], k=sizes["k"], batch=sizes["b"], dtype=dtype,
                   out_dtype=out_dtype, a_major=majors[0], b_major=majors[1], arch=arch)


def validate_problem(p: GemmProblem) -> None:
    """Raise ProblemError naming the first thing wrong with ``p``."""
    for name in ("m", "n", "k", "batch"):
        v = getattr(p, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ProblemError(f"{name} must be a positive integer, got {v!r}")
    if p.arch not in ARCHES:
        raise ProblemError(f"unknown arch {p.arch!r}; supported: {', '.join(ARCHES)}")
    for name in ("dtype", "out_dtype"):
        d = getattr(p, name)
        if d == "fp8_e4m3":
            raise ProblemError(
                f"{name}=fp8_e4m3 is not supported yet (needs scale handling); use bf16 or fp16"
            )
        if d not in SUPPORTED_DTYPES:
            raise ProblemError(f"unsupported {name} {d!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    # Operands no listed device can hold are a typo, not a problem: refused before a cost
    # model extrapolates a time for them (or numpy overflows on their sizes).
    device = largest_memory(p.arch)
    if p.min_bytes > device.memory_gib * 2**30:
        raise ProblemError(f"A, B and D of {p.batch} x ({p.m} x {p.k}) @ ({p.k} x {p.n}) take "
                           f"{p.min_bytes / 2**30:.3g} GiB, more than any {p.arch} device holds "
                           f"({device.name}: {device.memory_gib} GiB); check the sizes")
    if p.a_major not in ("k", "m"):
        raise ProblemError(f"a_major must be 'k' or 'm', got {p.a_major!r}")
    if p.b_major not in ("k", "n"):
        raise ProblemError(f"b_major must be 'k' or 'n', got {p.b_major!r}")
    # TMA needs 16-byte aligned strides: the contiguous extent of every operand must be a
    # multiple of 16 bytes (quack's tensor checks assert the same divisibility).
    e, o = DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    contiguous = {
        "A": ("k" if p.a_major == "k" else "m", p.k if p.a_major == "k" else p.m, e),
        "B": ("k" if p.b_major == "k" else "n", p.k if p.b_major == "k" else p.n, e),
        "D": ("n", p.n, o),
    }
    for operand, (dim, extent, width) in contiguous.items():
        if (extent * width) % TMA_ALIGN_BYTES:
            elems = TMA_ALIGN_BYTES // width
            raise ProblemError(
                f"{dim.upper()}={extent} is the contiguous dimension of {operand} and must be a "
                f"multiple of {elems} for {getattr(p, 'out_dtype' if operand == 'D' else 'dtype')} "
                f"(16-byte TMA alignment)"
            )
