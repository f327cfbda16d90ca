"""GEMM problems: a dense GEMM (``GemmProblem``: D[b] = A[b] @ B[b], what one Inductor
mm/addmm/bmm node asks for) and a grouped one (``GroupedProblem``: an MoE layer's expert GEMMs,
one per expert over a ragged dimension, what torch._grouped_mm runs).

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

    family = "dense"  # its configs' family (``rules.FAMILIES``); a class attribute, not a field

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
        arch, dtype, out_dtype, majors, sizes = _parse_key(
            key, "bmnk", "sm90:bf16->bf16:kk:b1:m4096:n14336:k4096")
        if len(majors) != 2:
            raise _not_a_key(key, "sm90:bf16->bf16:kk:b1:m4096:n14336:k4096")
        return cls(m=sizes["m"], n=sizes["n"], k=sizes["k"], batch=sizes["b"], dtype=dtype,
                   out_dtype=out_dtype, a_major=majors[0], b_major=majors[1], arch=arch)


# The GEMMs of an MoE layer's experts, as quack runs them: the ragged dimension ("m": rows of
# A and D grouped by expert, through cu_seqlens_m; "k": the reduction, through cu_seqlens_k)
# and the operand majors it needs (quack's _build_gemm_plan asserts A k-major and D n-major
# for varlen M, A m-major and B n-major for varlen K).
GROUPED_GEMMS: dict[str, tuple[str, str, str]] = {  # gemm: (ragged dim, a_major, b_major)
    "fwd": ("m", "k", "k"),    # X (M_total, K) @ W[e]^T, W (E, N, K): B is K-major
    "dgrad": ("m", "k", "n"),  # dY (M_total, K=N_out) @ W[e], W (E, K, N=K_in): B is N-major
    "wgrad": ("k", "m", "n"),  # dY^T (M=N_out, K_total) @ X (K_total, N=K_in) -> (E, M, N)
}


@dataclass(frozen=True)
class GroupedProblem:
    """E experts' GEMMs in one launch: quack's varlen M (``fwd``, ``dgrad``) or varlen K
    (``wgrad``) GEMM, torch._grouped_mm's 2D x 3D and 2D x 2D cases.

    ``m``, ``n`` and ``k`` are the GEMM's dims, the ragged one being the total over the experts:
    for fwd and dgrad ``m`` is M_total, the routed rows (tokens x top-k); for wgrad ``k`` is.
    The host knows the total, not the per-expert split, so neither does the problem. The
    operand majors follow from ``gemm`` (``GROUPED_GEMMS``)."""

    experts: int
    m: int
    n: int
    k: int
    gemm: str = "fwd"
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    arch: str = "sm90"

    def __post_init__(self) -> None:
        validate_grouped_problem(self)

    @property
    def ragged(self) -> str:
        """The dimension split among the experts: "m" or "k"."""
        return GROUPED_GEMMS[self.gemm][0]

    @property
    def family(self) -> str:
        """The config family (``rules.FAMILIES``) whose rules this problem's kernel obeys."""
        return grouped_family(self.gemm)

    @property
    def a_major(self) -> str:
        return GROUPED_GEMMS[self.gemm][1]

    @property
    def b_major(self) -> str:
        return GROUPED_GEMMS[self.gemm][2]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def active_experts(self) -> int:
        """Experts with work at most: all of them for varlen K (an expert without rows still
        writes its zero gradient), at most one per routed row for varlen M."""
        return self.experts if self.ragged == "k" else min(self.experts, self.m)

    @property
    def min_bytes(self) -> int:
        """Bytes the experts' GEMMs move at least: the ragged operands once, and once each
        active expert's own operand (its weight for varlen M, its output for varlen K)."""
        e, o = DTYPE_BYTES[self.dtype], DTYPE_BYTES[self.out_dtype]
        m, n, k, g = self.m, self.n, self.k, self.active_experts
        if self.ragged == "m":
            return (m * k + g * k * n) * e + m * n * o
        return (m * k + k * n) * e + g * m * n * o

    def to_dict(self) -> dict:
        return asdict(self)

    def key(self) -> str:
        """Stable text key, apart from every dense problem's (the GEMM's name where a dense key
        has its majors, experts where it has a batch)."""
        return (f"{self.arch}:{self.dtype}->{self.out_dtype}:{self.gemm}:e{self.experts}:"
                f"m{self.m}:n{self.n}:k{self.k}")

    @classmethod
    def from_key(cls, key: str) -> GroupedProblem:
        """The problem whose ``key()`` is ``key``; ProblemError for other text."""
        arch, dtype, out_dtype, gemm, sizes = _parse_key(
            key, "emnk", "sm90:bf16->bf16:fwd:e256:m16384:n4096:k7168")
        return cls(experts=sizes["e"], m=sizes["m"], n=sizes["n"], k=sizes["k"], gemm=gemm,
                   dtype=dtype, out_dtype=out_dtype, arch=arch)


def problem_from_dict(d: dict) -> GemmProblem | GroupedProblem:
    """The problem whose ``to_dict()`` is ``d``: a grouped one where it names its experts."""
    return GroupedProblem(**d) if "experts" in d else GemmProblem(**d)


def layout_name(problem: GemmProblem | GroupedProblem) -> str:
    """A's and B's majors ("kk" is nn.Linear's forward, "kn" its input gradient, "mn" its
    weight gradient), with " bmm" after a batched problem's; a grouped problem's follow its
    GEMM (fwd kk, dgrad kn, wgrad mn)."""
    return problem.a_major + problem.b_major + (" bmm" if getattr(problem, "batch", 1) > 1
                                                else "")


def grouped_family(gemm: str) -> str:
    """The config family of the grouped GEMM ``gemm``: varlen_m or varlen_k; ProblemError for a
    name not in GROUPED_GEMMS."""
    if gemm not in GROUPED_GEMMS:
        raise ProblemError(f"unknown grouped GEMM {gemm!r}; known: {', '.join(GROUPED_GEMMS)}")
    return f"varlen_{GROUPED_GEMMS[gemm][0]}"


def _not_a_key(key: str, example: str) -> ProblemError:
    return ProblemError(f"{key!r} is not a problem key (like {example})")


def _parse_key(key: str, letters: str, example: str):
    """(arch, dtype, out_dtype, tag, sizes by letter) of ``arch:dtype->out:tag:<l><int>...``
    with size letters ``letters`` in order; ProblemError for other text."""
    try:
        arch, dtypes, tag, *dims = key.split(":")
        dtype, out_dtype = dtypes.split("->")
        sizes = {d[0]: int(d[1:]) for d in dims}
        if [d[0] for d in dims] != list(letters):
            raise ValueError(key)
    except ValueError:
        raise _not_a_key(key, example) from None
    return arch, dtype, out_dtype, tag, sizes


def validate_problem(p: GemmProblem) -> None:
    """Raise ProblemError naming the first thing wrong with ``p``."""
    _check_positive(p, ("m", "n", "k", "batch"))
    _check_arch_and_dtypes(p)
    _check_fits(p)
    if p.a_major not in ("k", "m"):
        raise ProblemError(f"a_major must be 'k' or 'm', got {p.a_major!r}")
    if p.b_major not in ("k", "n"):
        raise ProblemError(f"b_major must be 'k' or 'n', got {p.b_major!r}")
    if p.k == 1 and (p.a_major == "m" or p.b_major == "n"):  # a weight gradient of one token
        raise ProblemError("K=1 with an m-major A or an n-major B: the one-column operand's "
                           "strides do not tell its major, and quack's checks refuse it")
    _check_alignment(p)


def validate_grouped_problem(p: GroupedProblem) -> None:
    """Raise ProblemError naming the first thing wrong with ``p``."""
    _check_positive(p, ("experts", "m", "n", "k"))
    grouped_family(p.gemm)
    _check_arch_and_dtypes(p)
    _check_fits(p)
    _check_alignment(p)


def _check_fits(p) -> None:
    """Operands no listed device can hold are a typo, not a problem: refused before a cost
    model extrapolates a time for them (or numpy overflows on their sizes)."""
    device = largest_memory(p.arch)
    if p.min_bytes > device.memory_gib * 2**30:
        what = (f"A, B and D of {p.batch} x ({p.m} x {p.k}) @ ({p.k} x {p.n})"
                if isinstance(p, GemmProblem) else f"the operands of {p.key()}")
        raise ProblemError(f"{what} take {p.min_bytes / 2**30:.3g} GiB, more than any {p.arch} "
                           f"device holds ({device.name}: {device.memory_gib} GiB); check the sizes")


def _check_positive(p, names) -> None:
    for name in names:
        v = getattr(p, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ProblemError(f"{name} must be a positive integer, got {v!r}")


def _check_arch_and_dtypes(p) -> None:
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


def _check_alignment(p) -> None:
    """TMA needs 16-byte aligned strides: the contiguous extent of every operand must be a
    multiple of 16 bytes (quack's tensor checks assert the same divisibility)."""
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
