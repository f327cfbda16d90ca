"""``enable()``: install cutetune into Inductor, and restore what was there on exit."""

from __future__ import annotations

import logging
import os
import time

from torch._inductor import config as inductor_config
from torch._inductor import virtualized
from torch._inductor.select_algorithm import (
    get_algorithm_selector_cache,
)

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from ... import settings
from ...models.heuristics import Heuristics, ModelHeuristics, PackagedHeuristics
from ..kernels import aot, grouped_mm, launcher, problems, quack_gemm, swiglu
from ..kernels.helper import is_library, kernel_key, shared_prefetcher, start_for_this_gpu
from ..kernels.problems import TORCH_DTYPE_OF, cuda_device_name
from . import choices as hook, grouped, template_cache
from .choices import _SOURCES, ChoicesFactory, send_kernels
from .decisions import REDUCED_TOP_K, decide_swiglu, host_bound_us, triton_takers
from .feedback import FeedbackRecorder
from .passes import (EarlyPrefetchPass, GemvPass, GroupedMmPass, SwigluFusionPass,
                     tune_reductions)

log = logging.getLogger(__name__)


_UNSET = object()
_HANDLER_KEY = virtualized._choices._key


# How long a node's benchmark waits for the compile workers before compiling here instead:
# the helper's start (its imports) plus a few rounds of compiles, the slowest of all 1200 sm90
# kernels taking 6.2 s on the H200 host (data/reports/gpu/warm_space_check_h200x2.json.gz).
PREFETCH_WAIT_S = 60.0


def await_prefetched(choices: list) -> list:
    """Inductor preprocessing hook (reduced mode), run on each node's choices just before they
    are benchmarked: import quack here if a kernel launches through it (meanwhile the workers
    compile), then wait for the node's kernels that the workers are still building and that
    are not built already, rather than build them one by one in this process (the wait is
    logged). Choices pass through unchanged."""
    kernels = [k for k in (getattr(c, "cutetune_kernel", None) for c in choices) if k]
    if kernels and hook._prefetch_for is not None:
        keys = [key for _, key in kernels]
        try:
            if not all(is_library(k) for k in keys):
                quack_gemm.import_quack()
            t0 = time.perf_counter()
            ready = hook._prefetch_for(kernels[0][0]).wait_for(keys, timeout=PREFETCH_WAIT_S)
            log.info("cutetune: waited %.2f s for the compile helper's %d kernels of a node%s",
                     time.perf_counter() - t0, len(keys), "" if ready else " (timed out)")
        except Exception as e:  # noqa: BLE001  (the benchmark compiles what is missing)
            log.warning("cutetune: waiting for prefetched kernels failed (%s: %s)",
                        type(e).__name__, e)
    return choices


def _swap_thread_handler(value):
    """Set (or with _UNSET clear) this thread's cached V.choices; return the previous one.
    Inductor builds it from ``inductor_choices_class`` on first use and then keeps it, so
    changing the config alone would not reach a thread that has compiled before."""
    prev = getattr(virtualized.threadlocal, _HANDLER_KEY, _UNSET)
    if value is _UNSET:
        if prev is not _UNSET:
            delattr(virtualized.threadlocal, _HANDLER_KEY)
    else:
        setattr(virtualized.threadlocal, _HANDLER_KEY, value)
    return prev


def early_prefetch_pass(factory: ChoicesFactory, user_pass) -> EarlyPrefetchPass:
    """The pre-grad pass that sends a graph's kernels from Dynamo's graph
    (``passes.py``), seconds before its first GEMM node is lowered."""
    heuristics = _SOURCES[factory.source]

    def send(problems: list[GemmProblem]) -> None:
        if hook._prefetch_for is None:  # compiled after the installation ended
            return
        for arch in dict.fromkeys(p.arch for p in problems):
            n = send_kernels([p for p in problems if p.arch == arch], arch, factory.mode,
                             heuristics, factory.top_k)
            log.info("cutetune: %d kernels of this graph sent to the compile workers from "
                     "Dynamo's graph", n)

    return EarlyPrefetchPass(send, f"{factory.mode}:k{factory.top_k}:{factory.source}:"
                             f"{factory.code}", lambda device: problems.device_arch(device), user_pass)


def swiglu_fusion_pass(factory: ChoicesFactory, user_pass) -> SwigluFusionPass:
    """The post-grad pass that fuses SwiGLU (``swiglu.py``) as ``decide_swiglu`` says."""
    heuristics = _SOURCES[factory.source]
    key = f"{factory.mode}:{factory.source}:{factory.code}"
    return SwigluFusionPass(lambda p: decide_swiglu(p, heuristics, host_bound_us()), key,
                            lambda device: problems.device_arch(device), user_pass, prepare_fused_kernel,
                            lambda p: decide_swiglu(p, heuristics, host_bound_us(), True),
                            lambda graph, arch: triton_takers(graph, arch, heuristics)[1] or ())


def grouped_pass(factory: ChoicesFactory, user_pass) -> GroupedMmPass:
    """The post-grad pass that gives grouped GEMMs the grouped model's picks
    (``grouped_mm.Picker``): every one in predicted mode, those of a dynamic size in reduced
    mode (its lowering benchmarks the others, ``grouped.ReducedLowering``)."""
    picker = grouped_mm.picker()
    return GroupedMmPass(picker, f"{factory.mode}:{picker.digest()}:{factory.code}",
                         lambda device: problems.device_arch(device), user_pass,
                         prepare_grouped_kernels, static=factory.mode != "reduced")


def prepare_grouped_kernels(kernels) -> None:
    """Have the compile helper (forked now if it is not running) build a graph's grouped
    kernels, ``(problem, config)`` pairs, into quack's disk cache while Inductor compiles, in
    parallel; their calls run ATen until each is built (``grouped_mm.building``). Compiled
    in the process at the first call instead, each cost a cold predicted-mode compile seconds
    (data/bench/moe_block_h200.json: predicted compiled 11-14 s over Inductor's default).
    Without a helper (quack's disk cache off, or no fork) the first call compiles as before."""
    helper = shared_prefetcher(kernels[0][0].arch)
    helper.submit(kernels)  # a kernel it did not take reads "done": built at its first call
    for problem, config in kernels:
        key = kernel_key(problem, config)
        grouped_mm.building(problem, config, lambda key=key: helper.build_state(key))


def post_grad_pass(factory: ChoicesFactory, user_pass, fuse_swiglu: bool, tune_gemv: bool):
    """The grouped GEMM pass, after the SwiGLU fusion (``fuse_swiglu``), after the one-row
    GEMVs (a GEMV leaves no mm to fuse; tuned with ``tune_gemv``), after the user's pass."""
    gemv = GemvPass(f"{factory.mode}:{factory.code}",
                    lambda device: problems.device_arch(device), user_pass, tune=tune_gemv)
    return grouped_pass(factory, swiglu_fusion_pass(factory, gemv) if fuse_swiglu else gemv)


def prepare_fused_kernel(problem: GemmProblem, config: KernelConfig) -> None:
    """Get a fused SwiGLU kernel ready while Inductor compiles: unless its TVM-FFI library is
    built or linked from prebuilt kernel objects (``aot.ensure_library``), the compile helper
    builds it (``swiglu.build_library``; started now in predicted mode), and calls run ATen,
    unfused, until it is built, then launch it without importing quack (in later processes
    too). Nothing waits: on the H200 host the helper's library came 4.1-5.8 s after the
    compile even forked (data/bench/e2e_h200_1gpu_fork_predicted.json.gz), about what compiling
    through quack in the process cost the compile, 3.7-6.2 s
    (data/bench/e2e_h200_1gpu_aot*.json.gz). Without a C
    compiler to link with, or with quack's disk cache off, the first launch compiles through
    quack here. No import runs in a thread meanwhile: on the H200 host quack's import holds
    the GIL throughout and a thread hid none of it (data/bench/import_probe_h200.json)."""
    key = swiglu.library_key(config, problem.arch, TORCH_DTYPE_OF[problem.dtype],
                             (problem.a_major, problem.b_major))
    if aot.ensure_library(key):
        return
    helper = shared_prefetcher(problem.arch)
    if helper.enabled and aot.can_link():
        key = helper.submit_swiglu(problem, config)
        swiglu.building(key, lambda: helper.build_state(key))


def _resolve_source(model) -> str:
    """Register the heuristics behind ``model`` and return their digest."""
    if model is None:
        h = PackagedHeuristics(device=cuda_device_name)
    elif isinstance(model, (str, os.PathLike)):
        h = Heuristics.load(model)
    elif hasattr(model, "lookup"):
        h = model
    elif hasattr(model, "rank") and hasattr(model, "prefers_cublas"):
        h = ModelHeuristics(model)
    else:
        raise TypeError(f"model must be a heuristics file path, an object with lookup(problem), "
                        f"or a cost model with rank() and prefers_cublas(); got {type(model)}")
    digest = getattr(h, "digest", None) or f"{type(h).__qualname__}@{id(h):x}"
    _SOURCES[digest] = h
    return digest


def _chain_pass(slot: str, kind, make) -> object:
    """Set Inductor's custom-pass ``slot`` to ``make(user_pass)`` (None: to the user's pass
    alone), where the user's pass is what the slot holds without an outer installation's
    passes of ``kind`` (a type or a tuple of them); the slot's previous value, for
    ``disable``."""
    prev = user_pass = getattr(inductor_config, slot)
    while isinstance(user_pass, kind):
        user_pass = user_pass.user_pass
    setattr(inductor_config, slot, make(user_pass) if make is not None else user_pass)
    return prev


def _set_config(name: str):
    return lambda value: setattr(inductor_config, name, value)


# What an installation replaces, by slot: how to put back the value it found.
_RESTORE = {
    "post_pass": _set_config("post_grad_custom_post_pass"),
    "pre_pass": _set_config("pre_grad_custom_pass"),
    "template_manager": template_cache.uninstall,
    "prefetch": lambda value: setattr(hook, "_prefetch_for", value),
    "choices_class": _set_config("inductor_choices_class"),
    "grouped_lowering": grouped.uninstall,
    "handler": _swap_thread_handler,
}
_ACTIVE: list["Installation"] = []  # the active installations, oldest first


class Installation:
    """An active ``enable()``: a context manager, or call ``disable()``. Restores the previous
    ``inductor_choices_class``, this thread's choices handler, the feedback savers, the
    prefetcher source, the pre-grad pass that feeds it, the preprocessing hook that waits for
    it, Triton's cache manager, the post-grad passes that fuse SwiGLU and pick grouped GEMMs'
    configs, and reduced mode's lowering of grouped GEMMs.

    Installations may be disabled in any order, not only the reverse of their creation: one
    disabled while a later one is still active hands what it found, slot by slot, to the
    next later installation that replaced that slot (it will put it back), and puts back
    itself only the slots no later one replaced."""

    def __init__(self, factory: ChoicesFactory | None, feedback: FeedbackRecorder | None,
                 prefetch_for=None, fuse_swiglu: bool = False, tune_gemv: bool = True) -> None:
        self.factory, self.feedback = factory, feedback
        prev = self._prev = {}  # slot -> the value this installation found there
        prev["post_pass"] = _chain_pass(
            "post_grad_custom_post_pass", (GemvPass, SwigluFusionPass, GroupedMmPass),
            (lambda user: post_grad_pass(factory, user, fuse_swiglu, tune_gemv))
            if factory is not None else None)
        prev["pre_pass"] = _chain_pass(
            "pre_grad_custom_pass", EarlyPrefetchPass,
            (lambda user: early_prefetch_pass(factory, user))
            if factory is not None and prefetch_for is not None else None)
        if factory is not None:
            prev["template_manager"] = template_cache.install()
        prev["prefetch"], hook._prefetch_for = hook._prefetch_for, prefetch_for
        if factory is not None and factory.mode == "reduced":
            prev["grouped_lowering"] = grouped.install(
                grouped_mm.picker(), factory.top_k, problems.device_arch, prefetch_for)
        elif grouped.installed():  # another mode inside a reduced one: Inductor's lowering
            prev["grouped_lowering"] = grouped.install()
        prev["choices_class"] = inductor_config.inductor_choices_class
        if factory is not None:
            new_class = factory
        elif isinstance(prev["choices_class"], ChoicesFactory):
            new_class = None  # "off" lifts an outer cutetune installation
        else:
            new_class = prev["choices_class"]
        inductor_config.inductor_choices_class = new_class
        prev["handler"] = _swap_thread_handler(_UNSET)
        if feedback is not None:
            get_algorithm_selector_cache().add_feedback_saver(feedback)
        self.waits_for_prefetch = prefetch_for is not None
        if self.waits_for_prefetch:
            get_algorithm_selector_cache().add_preprocessing_fn(await_prefetched)
        self.active = True
        _ACTIVE.append(self)

    def disable(self) -> None:
        if not self.active:
            return
        self.active = False
        i = _ACTIVE.index(self)
        later = _ACTIVE[i + 1:]
        del _ACTIVE[i]
        for slot, value in self._prev.items():
            heir = next((x for x in later if slot in x._prev), None)
            if heir is not None:
                heir._prev[slot] = value
            else:
                _RESTORE[slot](value)
        tune_reductions(False)  # a compile without Dynamo's end callback may have left them on
        cache = get_algorithm_selector_cache()
        if self.feedback is not None and self.feedback in cache.feedback_saver_fns:
            cache.feedback_saver_fns.remove(self.feedback)
        if self.waits_for_prefetch and await_prefetched in cache.preprocessing_fns:
            cache.preprocessing_fns.remove(await_prefetched)

    def __enter__(self) -> "Installation":
        return self

    def __exit__(self, *exc) -> None:
        self.disable()


def enable(mode: str = "predicted", top_k: int | None = None, model=None,
           feedback: str | os.PathLike | None = None, prefetch=True,
           fuse_swiglu: bool | None = None, tune_gemv: bool | None = None, *,
           environ=None) -> Installation:
    """Install cutetune's choices into Inductor; use as a function or a context manager.
    An argument left None takes its variable (``settings.COMPILE_VARIABLES``; top_k's and
    feedback's in reduced mode only) from ``environ`` (default os.environ; ``{}``: none), so
    that a deployment's switch holds whichever way its code enables cutetune.

    ``model``: a heuristics file (``cutetune emit``), an object with ``lookup(problem)``, or a
    cost model with ``rank``/``prefers_cublas``; default: the heuristics packaged with
    cutetune, which ask the cost model packaged beside them for a shape they have no exact
    entry for (``PackagedHeuristics``). ``top_k``: reduced-mode candidates (default REDUCED_TOP_K). ``feedback``: a
    dataset folder that receives Inductor's reduced-mode timings. ``prefetch`` (reduced mode):
    compile each graph's candidate kernels in parallel worker processes, started now so they
    load while Dynamo traces (``cutetune.enable`` starts them before Inductor's import) and
    sent the kernels from Dynamo's graph (True), not at all (False), or a callable ``arch ->
    object with submit(kernels)``. Both modes keep the Triton template kernels they lead Inductor to
    compile in cutetune's kernel cache (``template_cache.py``), and with ``fuse_swiglu``
    run ``silu(g) * mm(x, w)`` as one quack GEMM where ``decide_swiglu`` says (``swiglu.py``).
    Under CUDA graphs a one-row GEMM becomes a GEMV that Inductor fuses (``GemvPass``), and
    with ``tune_gemv`` its graph's reductions are tuned as max-autotune tunes them: seconds more
    of compile for that graph, for a faster step.
    """
    mode = settings.parse_mode(mode)
    if mode != "off":
        def unset(argument, value, applies=True):
            return (settings.compile_setting(argument, environ) if value is None and applies
                    else value)

        reduced = mode == "reduced"
        top_k, feedback = unset("top_k", top_k, reduced), unset("feedback", feedback, reduced)
        model, fuse_swiglu = unset("model", model), unset("fuse_swiglu", fuse_swiglu)
        tune_gemv = unset("tune_gemv", tune_gemv)
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    if mode == "predicted" and top_k not in (None, 1):
        raise ValueError("predicted mode offers one config per node; top_k is for reduced mode")
    if feedback is not None and mode != "reduced":
        raise ValueError("feedback records Inductor's benchmarks, which only reduced mode runs")
    if mode == "off":
        return Installation(None, None)
    k = 1 if mode == "predicted" else (top_k or REDUCED_TOP_K)
    launcher.extern_choices()  # generated code (also from the FX cache) calls these by name
    factory = ChoicesFactory(mode, k, _resolve_source(model))
    prefetch_for = None
    if mode == "reduced" and prefetch:
        # predicted mode does not prefetch plain GEMMs (one kernel per served node compiles in
        # less time than the helper takes to start), and starts the helper only when a fused
        # SwiGLU kernel needs building (``prepare_fused_kernel``)
        prefetch_for = shared_prefetcher if prefetch is True else prefetch
        if prefetch is True:  # started now (if ``cutetune.enable`` has not), it imports
            start_for_this_gpu()  # quack while Dynamo traces
    return Installation(factory, FeedbackRecorder(feedback) if feedback is not None else None,
                        prefetch_for, fuse_swiglu, tune_gemv)


def enable_from_env(environ=None) -> Installation | None:
    """``enable()`` in the mode of CUTETUNE_MODE, its arguments from the environment too.
    Returns None when the mode is off (or unset)."""
    mode = settings.compile_mode(environ)
    return None if mode == "off" else enable(mode, environ=environ)
