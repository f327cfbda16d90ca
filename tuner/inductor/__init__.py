"""torch.compile integration: quack's CuteDSL GEMMs as Inductor choices for mm, addmm and bmm.

Inductor (2.11 to 2.13) has no CuteDSL GEMM for Hopper. We add one without patching torch:
``enable()`` installs an ``InductorChoices`` subclass through
``torch._inductor.config.inductor_choices_class``; its ``get_template_configs`` replaces the
candidate list of every mm/addmm/bmm node it can serve with extern-kernel choices calling
``tuner/kernels/launcher.quack_mm_out`` with one config each.

Modes:
  predicted  one choice per node: the heuristics' top-1 config, or ATen when the model
             prefers cuBLAS (for a host-bound GEMM, see below, the heuristics' Triton
             config or ATen). A single choice is never benchmarked
             (``AlgorithmSelectorCache.__call__`` returns it as is), so compiling costs a table
             lookup plus the kernel compile, which quack caches on disk.
  reduced    the top-k configs plus ATen, benchmarked by Inductor; ``feedback=PATH`` appends
             those timings to a cutetune dataset. The top-k kernels of a graph's GEMMs go to
             parallel compile workers (``tuner/kernels/helper.py``) from Dynamo's graph, before AOTAutograd
             (a pre-grad pass, ``passes.py``), and any it missed when the graph's
             first GEMM node is lowered, so they compile at once instead of one by one in the
             benchmark.
  off        nothing installed (an active cutetune installation is lifted for the block).
A 2D mm/addmm whose M alone is dynamic gets, in both modes, one choice that runs predicted
mode's config for the range of M holding each call's M (``by_m_choices``). Nodes quack cannot
run (dtype, layout, alignment, other dynamic sizes, a GPU other than sm90/sm100) keep
Inductor's own candidates: ATen alone under default settings. Both modes leave to
Inductor the GEMMs too small to cover a quack launch's host time (``QUACK_LAUNCH_HOST_US``)
unless the graph runs under CUDA graphs: the cost model and Inductor's benchmark time the GPU
only, and at small M a step without CUDA graphs waits on the host. Where such a plain mm is
also memory-bound, predicted mode gives it the one Triton config that the heuristics file
names for it (measured by scripts/triton_mm_sweep.py and scripts/triton_mm_retime.py, fitted
by models/triton_mm.py), and reduced mode the same where the retime measured the shape, else
benchmarks Inductor's Triton mm templates, but only for the mm that the
heuristics' launch costs give them, weighing all such mm of a graph together
(``graph_triton``); the others keep ATen. A Triton launch
from generated code costs less host time than ATen's extern call, and the template takes the
node's pointwise epilogue, but on the GPU it mostly runs longer than cuBLAS
(data/inputs/triton_mm/h200_bf16_retimed_top4.jsonl), and on compute-bound GEMMs much longer
(data/bench/step_h200_hostbound.json.gz).

Under CUDA graphs (Inductor's cudagraphs, i.e. mode="reduce-overhead", or a capture in
progress) a replay launches nothing from the host: both modes then decide by GPU time alone,
with no host-bound rule and no weighing of a graph's Triton launches. A GEMM whose ATen, Triton
and quack candidates the heuristics' retime timed together (``models/gpu_times.py``) gets the
fastest of them, alone; another gets the heuristics' quack or ATen answer as above.

Both modes also install a post-grad pass (``passes.py``) that runs a SwiGLU MLP's
``silu(gate) * (x @ W_up)`` as one quack GEMM with the product in its epilogue
(``swiglu.py``), where the up projection is not host-bound and the heuristics say so: Inductor
cannot fuse the pointwise kernel into an extern GEMM, and cuBLAS has no such kernel.

Compile-time decisions come from the heuristics file (``models/heuristics.py``, its lookups in ``decisions.py``), not the cost model,
so lowering stays cheap. The installed choices are part of Inductor's FX-graph cache key
(``uuid()`` on 2.13, the pickled factory on 2.11): mode, top-k, the heuristics' digest and
a digest of the code that makes the decisions.

Compilation is lazy: a function compiled inside ``with enable(...)`` must also be first *called*
there, or Inductor compiles it after the block with the previous choices.
"""

from .install import Installation, enable, enable_from_env

__all__ = ["Installation", "enable", "enable_from_env"]
