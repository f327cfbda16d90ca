"""Validity rules: one function per rule, the single source of truth for enumeration,
sampling, the Optuna space and the tuner's pruning.

Each rule returns True when the config satisfies it. Its docstring says why a config that
fails it is rejected; where the reason is quack's or the hardware's, it names the check.
Config rules see (config, arch); problem rules also see the problem.

Rules belong to config families (``FAMILIES``): the dense GEMM's, and the grouped GEMM's two
kernels, varlen M (an MoE forward or input gradient) and varlen K (its weight gradient). The
tile, cluster and arch rules hold for all three: the same kernel classes run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import KernelConfig
from .problem import DTYPE_BYTES, GemmProblem, GroupedProblem, ProblemError

SMEM_BYTES = {"sm90": 227 * 1024, "sm100": 227 * 1024}  # per-CTA opt-in maximum
MMA_WARPGROUP_THREADS = 128
TILE_K_BYTES = 128  # quack's default K tile: 4 MMA k-steps = 64 elements of a 16-bit dtype


FAMILIES = ("dense", "varlen_m", "varlen_k")
GROUPED = ("varlen_m", "varlen_k")


@dataclass(frozen=True)
class Rule:
    name: str
    arches: tuple[str, ...]
    check: Callable
    needs_problem: bool
    families: tuple[str, ...] = ("dense",)

    @property
    def why(self) -> str:
        return " ".join((self.check.__doc__ or "").split())


CONFIG_RULES: list[Rule] = []  # the dense family's
PROBLEM_RULES: list[Rule] = []  # the dense family's
# Every family's rules, in registration order.
FAMILY_RULES: dict[str, list[Rule]] = {f: [] for f in FAMILIES}


def _rule(*arches: str, problem: bool = False, families: tuple[str, ...] = ("dense",)):
    def register(fn):
        r = Rule(fn.__name__, arches, fn, problem, families)
        if "dense" in families:
            (PROBLEM_RULES if problem else CONFIG_RULES).append(r)
        for f in families:
            FAMILY_RULES[f].append(r)
        return fn

    return register


def family_of(problem: GemmProblem | GroupedProblem | None, family: str | None = None) -> str:
    """The config family of ``problem`` (``family`` when no problem is given, else dense);
    ProblemError for an unknown family or one that is not the problem's."""
    if family is not None and family not in FAMILIES:
        raise ProblemError(f"unknown config family {family!r}; known: {', '.join(FAMILIES)}")
    own = problem.family if problem is not None else None
    if own and family and own != family:
        raise ProblemError(f"a {own} problem has no {family} configs")
    return own or family or "dense"


def family_rules(family: str, arch: str, problem: bool | None = None) -> list[Rule]:
    """The rules of ``family`` on ``arch``: config rules only (``problem=False``), problem
    rules only (True), or both (None)."""
    return [r for r in FAMILY_RULES[family] if arch in r.arches
            and (problem is None or r.needs_problem == problem)]


# ---------------------------------------------------------------- shared arithmetic
def mma_atoms(c: KernelConfig) -> int:
    """Warpgroup MMA atoms that split one CTA tile on sm90 (GemmSm90.__init__'s atom layout)."""
    if c.pingpong:
        return 1  # each of the two warpgroups owns a whole tile
    if c.tile_m == 192:
        return 3 if c.tile_n <= 128 else 2
    return 1 if c.tile_m == 64 else 2


def accumulator_registers(c: KernelConfig) -> int:
    """fp32 accumulator registers per MMA thread on sm90."""
    return c.tile_m * c.tile_n // (mma_atoms(c) * MMA_WARPGROUP_THREADS)


def tile_k(dtype: str) -> int:
    return TILE_K_BYTES // DTYPE_BYTES[dtype]


def kernel_b_major(c: KernelConfig, p: GemmProblem | GroupedProblem) -> str:
    """The major of the kernel's B operand after quack's swap_ab routing: the problem's B, or
    swapped the problem's A (K-major stays "k"; M-major is "n" in the kernel's frame)."""
    if not c.swap_ab:
        return p.b_major
    return "k" if p.a_major == "k" else "n"


def epilogue_smem_bytes(c: KernelConfig, out_dtype: str = "bf16") -> int:
    """Estimate of the epilogue's staging buffer: two stages of a (64 x min(tile_n, 32)) tile."""
    return 2 * 64 * min(c.tile_n, 32) * DTYPE_BYTES[out_dtype]


def ab_stage_bytes(c: KernelConfig, dtype: str = "bf16") -> int:
    return (c.tile_m + c.tile_n) * tile_k(dtype) * DTYPE_BYTES[dtype]


def pipeline_stages(c: KernelConfig, arch: str, dtype: str = "bf16", out_dtype: str = "bf16") -> int:
    """A/B pipeline stages that fit the shared-memory budget (quack's _compute_stages, estimated:
    what the epilogue and barriers leave, divided by one stage of A and B tiles)."""
    free = SMEM_BYTES[arch] - epilogue_smem_bytes(c, out_dtype) - 1024
    return free // ab_stage_bytes(c, dtype)


# ---------------------------------------------------------------- sm90 (GemmSm90.__init__)
@_rule("sm90", families=FAMILIES)
def sm90_tile_m(c: KernelConfig, arch: str) -> bool:
    """sm90 CTA tile M must be 64/128/192 with pingpong (one warpgroup per tile) and
    64/128/192/256 cooperative (GemmSm90 raises 'CTA tile shape M must be ...'; 320 is left out:
    it only splits along N and never wins a 16-bit GEMM)."""
    return c.tile_m in ((64, 128, 192) if c.pingpong else (64, 128, 192, 256))


@_rule("sm90", families=FAMILIES)
def sm90_tile_n(c: KernelConfig, arch: str) -> bool:
    """sm90 CTA tile N must be a multiple of 16 within the per-mode maximum: pingpong 256/208/128
    for tile_m 64/128/192; cooperative tile_m 192 needs a multiple of 32 up to 256, others up
    to 256 (GemmSm90.__init__'s tile checks). A tile_m outside these is sm90_tile_m's to reject."""
    if c.tile_n % 16 or c.tile_n < 16:
        return False
    if c.pingpong:
        return c.tile_n <= {64: 256, 128: 208, 192: 128}.get(c.tile_m, 256)
    if c.tile_m == 192:
        return c.tile_n % 32 == 0 and c.tile_n <= 256
    return c.tile_n <= 256


@_rule("sm90", families=FAMILIES)
def sm90_accumulator_fits_registers(c: KernelConfig, arch: str) -> bool:
    """The fp32 accumulator must leave room in the MMA warpgroups' 240-register budget (quack's
    setmaxnreg split): at most 208 accumulator registers per thread, the most quack ships
    (128x208 pingpong, 256x208 cooperative); more spills to local memory. A design choice: the
    compiler accepts such tiles (256x256 cooperative compiles), they are just slow."""
    return accumulator_registers(c) <= 208


@_rule("sm90")
def sm90_static_scheduler(c: KernelConfig, arch: str) -> bool:
    """The dynamic persistent scheduler on sm90 needs a zeroed global semaphore per call; quack
    leaves it off on sm90 and so do we (it is an sm100 knob, via CLC). A design choice: the
    compiler accepts it."""
    return not c.is_dynamic_persistent


# ---------------------------------------------------------------- sm100 (GemmSm100)
@_rule("sm100", families=FAMILIES)
def sm100_no_pingpong(c: KernelConfig, arch: str) -> bool:
    """sm100 kernels have no pingpong mode: one MMA warp drives tcgen05 (quack's sm100 list
    sets pingpong=False). GemmSm100 ignores the flag, so the compiler accepts it; the rule keeps
    a pingpong=True twin of every sm100 kernel out of the space."""
    return not c.pingpong


@_rule("sm100", families=FAMILIES)
def sm100_tile_m(c: KernelConfig, arch: str) -> bool:
    """sm100 MMA tile M must be 64, 128 or 256, and 256 needs an even cluster_m: it is the
    2-CTA MMA split across a CTA pair (GemmSm100.is_valid_mma_tiler_and_cluster_shape)."""
    if c.tile_m not in (64, 128, 256):
        return False
    return c.tile_m != 256 or c.cluster_m % 2 == 0


@_rule("sm100", families=FAMILIES)
def sm100_tile_n(c: KernelConfig, arch: str) -> bool:
    """sm100 MMA tile N must be a multiple of 16 from 16 to 256 (the tcgen05 N range for 16-bit
    operands). Wider tiles (quack ships one 256x512) are left out: they take two MMAs per
    k-block and all 512 TMEM columns for the fp32 accumulator, leaving no second accumulator
    stage to overlap the epilogue, and the compiler is unreliable on them: tile_n 512 with
    tile_m 128 and an even cluster_m (the 2-CTA MMA) kills cute.compile with SIGFPE, while
    other tile_n 512 shapes compile."""
    return c.tile_n % 16 == 0 and 16 <= c.tile_n <= 256


# ---------------------------------------------------------------- both arches
@_rule("sm90", "sm100", families=FAMILIES)
def cluster_shape(c: KernelConfig, arch: str) -> bool:
    """Cluster dims must be powers of two with at most 8 CTAs per cluster (the portable cluster
    size; TMA multicast spans a cluster row or column). A launch limit, not a compile one: the
    compiler accepts 4x4 and 3x1 clusters, but more than 8 CTAs must be opted into at launch,
    and non-power-of-two dims are outside quack's validity check (GemmSm100's
    is_valid_mma_tiler_and_cluster_shape)."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
    return pow2(c.cluster_m) and pow2(c.cluster_n) and c.cluster_size <= 8


@_rule("sm90", "sm100")
def split_k_design(c: KernelConfig, arch: str) -> bool:
    """Split-K (1, 2 or 4) is for small-M/N, long-K problems, where tiles are few: it is paired
    only with tile_m <= 128 and clusters of at most 2 CTAs, the shapes such problems pick.
    Larger tiles with split-K never fill the device better than without. A design choice that
    keeps the space small: the compiler accepts the other pairings."""
    if c.split_k == 1:
        return True
    return c.split_k in (2, 4) and c.tile_m <= 128 and c.cluster_size <= 2


# ---------------------------------------------------------------- problem rules
@_rule("sm90", "sm100", problem=True)
def split_k_has_k_tiles(c: KernelConfig, p: GemmProblem) -> bool:
    """Each K split needs at least two K tiles: a split with less has nothing to pipeline and
    quack's split-K schedule assumes non-empty splits."""
    return c.split_k == 1 or -(-p.k // tile_k(p.dtype)) >= 2 * c.split_k


# ---------------------------------------------------------------- grouped (varlen M and K)
@_rule("sm90", "sm100", families=GROUPED)
def grouped_no_split_k(c: KernelConfig, arch: str) -> bool:
    """Grouped GEMMs take no split-K: quack's _build_gemm_plan raises 'split_k requires a dense
    GEMM (no varlen_m/varlen_k/gather_A)' before any compile, the varlen-M tile scheduler
    asserts split_k == 1, and prune_invalid_gemm_configs adds no split-K variant to a varlen
    call."""
    return c.split_k == 1


@_rule("sm90", "sm100", families=("varlen_m",))
def varlen_m_no_swap_ab(c: KernelConfig, arch: str) -> bool:
    """Varlen M cannot swap A and B: the ragged rows must stay the kernel's M (quack's
    config_supports rejects swap_ab with varlen_m, and gemm_tuned asserts 'Variable-length
    sequences not supported with swap_ab' before any compile). Varlen K may swap: its ragged
    dimension is K either way, and quack prunes nothing there."""
    return not c.swap_ab


@_rule("sm90", problem=True, families=FAMILIES)
def sm90_tile_192_wide_needs_k_major_b(c: KernelConfig, p: GemmProblem | GroupedProblem) -> bool:
    """On sm90 a cooperative 192-row tile wider than 128 (two MMA atoms side by side along N:
    GemmSm90.__init__'s atom layout) needs a K-major kernel B: with an N-major one cute.compile
    aborts (std::bad_variant_access) for dgrad and wgrad, swapped or not, while fwd's (B
    K-major) compile; quack's sm90 list leaves 192x256 out for the same abort ('IOT
    instruction (core dumped) in the bwd'). Dense GEMMs of an N-major kernel B abort alike
    (a plain x @ W with W stored (K, N); an M-major A swapped), and quack compiles in the
    caller's process: the abort would take the user's process down."""
    return c.pingpong or c.tile_m != 192 or c.tile_n <= 128 or kernel_b_major(c, p) == "k"


# ---------------------------------------------------------------- entry points
def violations(c: KernelConfig, arch: str, problem: GemmProblem | GroupedProblem | None = None,
               family: str | None = None) -> list[Rule]:
    """The rules ``c`` breaks on ``arch`` (and on ``problem`` when given), of the problem's
    config family (``family`` without a problem; dense when neither is given)."""
    fam = family_of(problem, family)
    bad = [r for r in family_rules(fam, arch, problem=False) if not r.check(c, arch)]
    if problem is not None:
        bad += [r for r in family_rules(fam, arch, problem=True) if not r.check(c, problem)]
    return bad


def is_valid(c: KernelConfig, arch: str, problem: GemmProblem | GroupedProblem | None = None,
             family: str | None = None) -> bool:
    return not violations(c, arch, problem, family)
