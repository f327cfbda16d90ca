"""quack's plain GEMM, one level below its public ``gemm``: import quack (seconds, once per
process, in the background where a compile allows), and launch one given KernelConfig through
``gemm_interface._gemm_execute``, keeping quack's dispatch plan for the next call with the
same metadata. Both the launcher (run time) and the library builder (compile time) launch
through here, so a library holds exactly the kernel quack's own call would run."""

from __future__ import annotations

import logging
import threading
import time
from functools import lru_cache

from ...space.config import KernelConfig

from . import runtime

log = logging.getLogger(__name__)


class MmPlan(runtime.Plan):
    """A plain GEMM's plan: beside ``runtime.Plan``, the arch and addend kind (``addend_kind``)
    and, once launched through quack, its GemmConfig and dispatch plan."""

    __slots__ = ("arch", "addend", "quack_config", "dispatch")

    def __init__(self, config: KernelConfig | None, arch: str | None = None,
                 addend: str | None = None, library: str | None = None) -> None:
        super().__init__(config, library)
        self.arch, self.addend = arch, addend
        # quack's GemmConfig is made at the first launch through quack: its type imports quack
        self.quack_config = self.dispatch = None



_QUACK: tuple | None = None  # quack's entry point and constants, once imported
_QUACK_LOCK = threading.Lock()  # one import at a time: the background one or the first launch's


def _quack() -> tuple:
    """quack's entry point and constants, imported on first use (quack takes seconds to
    import; nothing else here needs it). A thread that asks while another imports waits for
    that import instead of running its own; a failed import raises and is tried again on the
    next call."""
    global _QUACK
    if _QUACK is None:
        with _QUACK_LOCK:
            if _QUACK is None:
                t0 = time.perf_counter()
                from quack.gemm_config import SplitKMode
                from quack.gemm_interface import _gemm_execute
                from quack.rounding import RoundingMode

                log.info("cutetune: imported quack in %.2f s", time.perf_counter() - t0)
                _QUACK = (_gemm_execute, SplitKMode.SERIAL, RoundingMode.RN)
    return _QUACK


def import_quack() -> None:
    """Import quack now (seconds, once per process) rather than at the first launch."""
    _quack()


@lru_cache(maxsize=None)
def import_quack_in_background() -> threading.Thread:
    """Start importing quack in a daemon thread (once per process), for a compile that has
    just chosen a quack kernel: the import then overlaps the rest of the compile wherever that
    releases the GIL (Triton compile workers, disk, the GPU) instead of all landing on the
    first launch. A failed import is logged; the first launch retries it and raises there."""

    def run():
        try:
            _quack()
        except Exception as e:  # noqa: BLE001
            log.warning("cutetune: background import for quack failed (%s: %s)",
                        type(e).__name__, e)

    thread = threading.Thread(target=run, name="cutetune-import-quack", daemon=True)
    thread.start()
    return thread


def await_background_import() -> None:
    """Let ``import_quack_in_background``'s thread finish, if one was started: a fork while it
    runs would leave the child waiting forever on quack's module lock, held by a thread the
    child does not have (``helper.py`` forks the compile helper)."""
    if import_quack_in_background.cache_info().currsize:
        import_quack_in_background().join()


def launch(plan: MmPlan, a, b, out, c, alpha, beta, cu_seqlens_m=None,
           cu_seqlens_k=None, a_idx=None) -> None:
    """``out = alpha * (a @ b) + beta * c`` with ``plan``'s config. With ``cu_seqlens_m`` or
    ``cu_seqlens_k`` (int32, E + 1 offsets from 0) a grouped GEMM in torch._grouped_mm's
    layouts: varlen M, ``a`` (M_total, K) @ ``b`` (E, K, N) by row groups; varlen K, ``a``
    (M, K_total) @ ``b`` (K_total, N) into ``out`` (E, M, N) by reduction groups. With varlen
    M and ``a_idx`` (int32, M_total), the kernel reads row ``a_idx[i]`` of ``a`` as row i
    (quack's gather, for a config that ``quack.gemm_config.config_supports`` passes with
    gather_A: this launch does not check it). A plan launches one kind, with ``a_idx`` or
    without: its dispatch plan is the first launch's."""
    execute, serial, rn = _quack()
    cfg = plan.config
    if plan.quack_config is None:
        plan.quack_config = cfg.to_quack(plan.arch)
    bias = C = None
    if plan.addend == "bias":
        bias = c if c.dim() == 1 else c.select(0, 0)
    elif plan.addend == "c":
        C = c
    plan.dispatch = execute(
        a, b, out, C,
        bias=bias, alpha=float(alpha), beta=float(beta) if C is not None else 1.0,
        cu_seqlens_m=cu_seqlens_m, cu_seqlens_k=cu_seqlens_k, A_idx=a_idx, batch_idx_permute=None,
        add_to_output=False, dynamic_scheduler=cfg.is_dynamic_persistent,
        config=plan.quack_config, rounding_mode=rn, sr_seed=0, concat_layout=None,
        SFA=None, SFB=None, split_k=cfg.split_k, split_k_mode=serial,
        dispatch_plan=plan.dispatch,
    )


def quack_kernel(config: KernelConfig, arch: str):
    """``fn(a, b, out)``: the bare quack launch for one config, with no support checks and no
    ATen fallback. The measurement harness times exactly this; ``quack_mm_out`` runs it once a
    call is known to be supported."""
    plan = MmPlan(config, arch)
    return lambda a, b, out: launch(plan, a, b, out, None, 1.0, 1.0)


def grouped_kernel(config: KernelConfig, arch: str, ragged: str):
    """``fn(a, b, out, cu_seqlens)``: ``quack_kernel`` for a grouped GEMM whose ``ragged``
    dimension ("m" or "k") is split among the experts at ``cu_seqlens``."""
    plan, key = MmPlan(config, arch), {"m": "cu_seqlens_m", "k": "cu_seqlens_k"}[ragged]
    return lambda a, b, out, cu: launch(plan, a, b, out, None, 1.0, 1.0, **{key: cu})


def quack_dispatch_plan(config: KernelConfig, arch: str, a, b, out):
    """quack's dispatch plan of ``a @ b`` into ``out`` for ``config``, after launching it as
    ``quack_kernel`` does (``gemm_library`` builds libraries through this very call)."""
    plan = MmPlan(config, arch)
    launch(plan, a, b, out, None, 1.0, 1.0)
    return plan.dispatch
