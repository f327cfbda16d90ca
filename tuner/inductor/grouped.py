"""Reduced mode's grouped GEMMs: Inductor's own lowering of ``aten._grouped_mm`` benchmarks its
candidates (ATen and, as max-autotune has them, its Triton grouped templates) with the grouped
model's top-k quack configs among them, each an extern call of ``cutetune::grouped_mm`` with a
one-range table. Inductor's grouped lowering asks no ``InductorChoices`` hook for its
candidates, so this wraps the lowering and, for the call's duration, the selection it ends in.

Only nodes of a static ragged size come here: a dynamic token count gets the model's table per
range from ``GroupedMmPass`` as in predicted mode (one benchmark at the size hint would pick
one config for every size)."""

from __future__ import annotations

import logging

import torch
from torch._inductor import config as inductor_config

from ...space.problem import ProblemError
from ..kernels import grouped_mm, quack_gemm
from ..kernels.helper import kernel_key
from ..kernels.launcher import M_UNBOUNDED
from ..kernels.problems import grouped_problem, static_ints, table_ints

log = logging.getLogger(__name__)

_GROUPED_MM = torch.ops.aten._grouped_mm.default


def _problem(mat_a, mat_b, offs, arch):
    """The GroupedProblem of Inductor's grouped-mm inputs; ProblemError where quack cannot run
    it (a symbolic size among them)."""
    return grouped_problem(
        static_ints(mat_a.get_size(), "A sizes"), static_ints(mat_a.get_stride(), "A strides"),
        static_ints(mat_b.get_size(), "B sizes"), static_ints(mat_b.get_stride(), "B strides"),
        static_ints(offs.get_size(), "offsets")[0], mat_a.get_dtype(), mat_a.get_dtype(), arch)


class ReducedLowering:
    """``lowering(mat_a, mat_b, offs, bias, out_dtype, layout)`` in place of Inductor's:
    ``picker.ranked(problem, top_k)`` gives the quack configs, ``arch(device)`` quack's arch,
    ``prefetch(arch)``, if given, the compile helper whose ``submit`` builds their kernels
    (``install.await_prefetched`` waits for them before the benchmark)."""

    def __init__(self, original, picker, top_k: int, arch, prefetch=None) -> None:
        self.original, self.picker, self.top_k = original, picker, top_k
        self.arch, self.prefetch = arch, prefetch

    def __call__(self, mat_a, mat_b, offs=None, bias=None, out_dtype=None, layout=None):
        from torch._inductor.virtualized import V

        args = (mat_a, mat_b, offs, bias, out_dtype, layout)
        if offs is None or bias is not None or out_dtype not in (None, mat_a.get_dtype()) \
                or V.graph.cpp_wrapper:  # C++ cannot call the quack choices' Python
            return self.original(*args)
        arch = self.arch(mat_a.get_device())
        if arch is None or not self.picker.has_model(arch, mat_a.get_dtype()):
            return self.original(*args)  # no quack candidates: Inductor's own choice
        from torch._inductor.kernel import mm_grouped

        select = mm_grouped.autotune_select_algorithm

        def with_quack(name, choices, input_nodes, layout, *rest, **kwargs):
            return select(name, [*choices, *self.candidates(input_nodes, layout)], input_nodes,
                          layout, *rest, **kwargs)

        mm_grouped.autotune_select_algorithm = with_quack
        try:  # Inductor's Triton grouped templates are max-autotune's: ask for them too
            with inductor_config.patch(max_autotune_gemm=True):
                return self.original(*args)
        finally:
            mm_grouped.autotune_select_algorithm = select

    def candidates(self, input_nodes, layout) -> list:
        """The quack choices of a grouped mm whose inputs (A, B, offsets) Inductor has laid
        out; none where quack cannot run it or there is no model."""
        mat_a, mat_b, offs = input_nodes[:3]
        try:
            problem = _problem(mat_a, mat_b, offs, self.arch(mat_a.get_device()))
        except ProblemError as e:
            log.info("cutetune reduced grouped_mm: Inductor's candidates alone (%s)", e)
            return []
        configs = self.picker.ranked(problem, self.top_k)
        if not configs:
            return []
        prefetcher = self.prefetch(problem.arch) if self.prefetch is not None else None
        if prefetcher is not None:
            prefetcher.submit([(problem, c) for c in configs])
        quack_gemm.import_quack_in_background()  # the benchmark launches through quack
        choices = []
        for c in configs:
            caller = grouped_mm.extern_choice().bind(
                input_nodes, layout, table=tuple(table_ints(((M_UNBOUNDED, c),))))
            caller.description = c.short()
            if prefetcher is not None:
                caller.cutetune_kernel = (problem.arch, kernel_key(problem, c))
            choices.append(caller)
        log.info("cutetune reduced grouped_mm %s: quack %s among Inductor's candidates",
                 problem.key(), " ".join(c.short() for c in configs))
        return choices


def install(picker=None, top_k: int = 0, arch=None, prefetch=None):
    """Put ``ReducedLowering`` in place of ``aten._grouped_mm``'s lowering, or with no
    ``picker`` Inductor's own (an installation of another mode inside a reduced one); what
    was there, for ``uninstall``."""
    from torch._inductor.kernel import mm_grouped  # noqa: F401  (registers Inductor's)
    from torch._inductor.lowering import lowerings

    previous = lowerings[_GROUPED_MM]
    original = previous.original if isinstance(previous, ReducedLowering) else previous
    lowerings[_GROUPED_MM] = (original if picker is None
                              else ReducedLowering(original, picker, top_k, arch, prefetch))
    return previous


def installed() -> bool:
    """Whether ``ReducedLowering`` lowers ``aten._grouped_mm`` now."""
    from torch._inductor.lowering import lowerings

    return isinstance(lowerings.get(_GROUPED_MM), ReducedLowering)


def uninstall(previous) -> None:
    from torch._inductor.lowering import lowerings

    lowerings[_GROUPED_MM] = previous
