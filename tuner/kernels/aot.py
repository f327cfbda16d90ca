"""quack kernels run through TVM-FFI alone: no quack and no cutlass import where the model runs.

quack compiles a kernel into an object file whose entry point is a TVM-FFI function, and loads
it through cutlass's JIT linker; so the first quack kernel of a process pays cutlass's import
(seconds on the H200 host: data/bench/import_probe_h200.json). Here a GPU-blind process (the
compile helper of ``helper.py``) builds the kernel with quack, links its object file into a
shared library against cutlass's small runtime library and libtvm_ffi (with the system C
compiler, which Triton needs as well), and writes down the arguments quack's launch plan
passes besides the tensors. The model's process then loads the library with
``tvm_ffi.load_module`` (milliseconds) and calls it with those arguments. The one value that
depends on the GPU, how many clusters fit at once, is asked of the CUDA driver at run time the
way cutlass asks it (``max_active_clusters``).

A library is keyed by what built it (the kernel, the config, quack's, cutlass's and TVM-FFI's
versions, the machine, the epilogue's source), so a stale one is never loaded; anything
missing or failing here leaves the caller on quack's own path.

cutetune ships the object files of its heuristics' fused kernels (``PACKAGE``, written by
``cutetune prebuild --package``): where the environment matches the one they were built in,
the first use links one (milliseconds) instead of compiling it (seconds, and quack's import).
``CUTETUNE_FUSED_KERNELS`` names another such zip (a deployment's own prebuild), or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path


from ... import settings
from ...artifacts import package_versions, replacing, write_atomic
from ...errors import OutputError

FORMAT = 1
# What quack's plan build gets for the number of active clusters in the GPU-blind builder: it
# marks where the launch arguments carry that number, which the runtime fills in.
CLUSTERS_SENTINEL = 1_000_003
_PACKAGES = ("quack-kernels", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu12",
             "nvidia-cutlass-dsl-libs-cu13", "apache-tvm-ffi")
_RUNTIME_DISTS = ("nvidia-cutlass-dsl-libs-cu13", "nvidia-cutlass-dsl-libs-cu12")
PACKAGE = settings.PACKAGE_DATA / "fused_kernels.zip"

log = logging.getLogger(__name__)


class AotError(RuntimeError):
    """A kernel could not be built or loaded as a TVM-FFI library."""


# ---------------------------------------------------------------- keys and paths
@lru_cache(maxsize=None)
def _versions() -> tuple:
    return tuple(package_versions(_PACKAGES).items())


@lru_cache(maxsize=None)
def _source_digest(module: str) -> str:
    spec = importlib.util.find_spec(module)
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]


def build_environment() -> dict:
    """What a kernel's object file depends on besides the kernel: the compiler's and the
    runtime's package versions, the host machine, the epilogues' source."""
    return {"versions": dict(_versions()), "machine": platform.machine(),
            "epilogues": _source_digest("cutetune.tuner.kernels.epilogues")}


def kernel_key(spec: dict, environment: dict | None = None) -> str:
    """The library's name: a digest of what the kernel is (``spec``, plain JSON: its kind,
    config, arch, dtype) and of what built it (this environment, unless ``environment`` is
    given: a package's manifest)."""
    ident = [FORMAT, spec, environment if environment is not None else build_environment()]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def library_dir() -> Path:
    return settings.cache_dir() / "aot"


def library_paths(key: str) -> tuple[Path, Path]:
    """The shared library and its launch arguments (JSON, written last: it marks the pair
    complete)."""
    return library_dir() / f"{key}.so", library_dir() / f"{key}.json"


def object_path(key: str) -> Path:
    """quack's object file of the library, kept for ``write_package``."""
    return library_dir() / f"{key}.o"


def library_ready(key: str) -> bool:
    return library_paths(key)[1].exists()


def packaged_kernels() -> Path | None:
    """The zip of prebuilt kernel objects that first uses link from: the one
    ``CUTETUNE_FUSED_KERNELS`` names (empty: none), else the shipped ``PACKAGE``."""
    named = os.environ.get("CUTETUNE_FUSED_KERNELS")
    if named is None:
        return PACKAGE
    if not named.strip():
        return None
    if not Path(named).is_file():
        raise AotError(f"CUTETUNE_FUSED_KERNELS={named!r} is not a file (a zip written by "
                       "`cutetune prebuild --package`; empty for none)")
    return Path(named)


def ensure_library(key: str, package: Path | None = None) -> bool:
    """Whether the library ``key`` is built, linking it from prebuilt object files when they
    hold it (``install_packaged``; ``package``, else ``packaged_kernels()``); an install that
    fails is reported, and the helper or quack builds the kernel instead."""
    if library_ready(key):
        return True
    try:
        package = package or packaged_kernels()
        return package is not None and install_packaged(key, package)
    except AotError as e:
        log.warning("cutetune: %s", e)
        return False


# ---------------------------------------------------------------- building (GPU-blind, quack)
def _wire(value):
    """quack's launch arguments (NamedTuples, cutlass numerics, None) as the plain nested lists
    and numbers that the compiled function's TVM-FFI signature takes; AotError for anything
    else (a tensor or pointer baked into a plan cannot be replayed)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, tuple):
        return [_wire(v) for v in value]
    inner = getattr(value, "value", None)
    if isinstance(inner, (int, float)) and type(value).__module__.startswith("cutlass"):
        return inner
    raise AotError(f"launch argument of type {type(value).__name__} cannot be recorded")


def epi_plan_arguments(plan) -> dict:
    """What quack's ``EpiPlan.run`` passes to the compiled function besides A, B, D and C, for
    a plan whose launch has nothing per call (no epilogue scalars or scratch, no split-K, a
    static scheduler); AotError otherwise."""
    gp = plan.gemm_plan
    if gp.call_ops or plan.scratch or plan.out_names or gp.split_k != 1 \
            or gp.scheduler_static is None:
        raise AotError("the plan has per-call launch arguments")
    epi = gp.gemm_cls.EpilogueArguments._make(gp.arg_template.values())
    # launch_gemm's trailing arguments: epilogue, scheduler, varlen, SFA, SFB
    tail = _wire((epi, gp.scheduler_static, None, None, None))
    return {"b_kn": bool(plan.b_kn), "swapped": bool(plan.swapped), "tail": tail}


def gemm_plan_arguments(plan, swapped: bool) -> dict:
    """What quack's plain GEMM (``quack.gemm.run_gemm_plan``) passes to the compiled function
    besides A, B, D and C, for a plan with nothing per call (static epilogue and scheduler, no
    split-K); AotError otherwise. Unswapped, B goes (K, N) as is; swapped (``swap_ab``), the
    kernel's A is B^T, its B is A and its D is D^T."""
    if plan.epi_static is None or plan.scheduler_static is None or plan.split_k != 1 \
            or plan.use_d_as_c:
        raise AotError("the plan has per-call launch arguments")
    tail = _wire((plan.epi_static, plan.scheduler_static, None, None, None))
    # the scheduler's swizzle is a launch argument (not traced): one library serves every
    # swizzle of a config, the caller's set where the scheduler options hold it
    swizzle = [1, type(plan.scheduler_static)._fields.index("max_swizzle_size")]
    return {"b_kn": not swapped, "swapped": swapped, "d_transposed": swapped, "tail": tail,
            "swizzle_at": swizzle}


def cpu_operands(dtype, majors: tuple[str, str]) -> tuple:
    """(A, B, D): small CPU tensors of ``dtype``, A (M, K) and B (K, N) of these majors (quack's
    names), D row-major. A GPU-blind build compiles for symbolic sizes, so they stand for every
    problem of those majors."""
    import torch

    m, n, k = 256, 256, 128
    a = torch.empty(m, k, dtype=dtype) if majors[0] == "k" else torch.empty(k, m, dtype=dtype).t()
    b = torch.empty(k, n, dtype=dtype) if majors[1] == "n" else torch.empty(n, k, dtype=dtype).t()
    return a, b, torch.empty(m, n, dtype=dtype)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def can_link() -> bool:
    """Whether this machine has the C compiler that ``link`` needs."""
    return _compiler() is not None


@lru_cache(maxsize=None)
def runtime_libraries() -> tuple[str, ...]:
    """cutlass's runtime library and libtvm_ffi, found from their packages' file lists
    (importing cutlass to ask it would cost what the libraries save)."""
    libs = []
    for dist in _RUNTIME_DISTS:
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found = [f for f in files if f.name == "libcute_dsl_runtime.so" and "stubs" not in f.parts]
        if found:
            libs.append(str(Path(found[0].locate()).resolve()))
            break
    try:
        import tvm_ffi

        libs.append(tvm_ffi.libinfo.find_libtvm_ffi())
    except (ImportError, RuntimeError, OSError):
        pass
    if len(libs) != 2 or not all(Path(lib).exists() for lib in libs):
        raise AotError(f"cutlass's runtime library and libtvm_ffi were not both found "
                       f"(got {libs})")
    return tuple(libs)


def link(obj: Path, so: Path) -> None:
    """Link quack's object file into a shared library that finds cutlass's runtime and
    libtvm_ffi by absolute rpath (they are where this environment installed them)."""
    libs = runtime_libraries()
    if not can_link():
        raise AotError("no C compiler (cc or gcc, or $CC) to link the kernel library")
    cmd = [_compiler(), "-shared", "-o", str(so), str(obj), *libs]
    cmd += [f"-Wl,-rpath,{d}" for d in sorted({str(Path(p).parent) for p in libs})]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise AotError(f"linking failed: {' '.join(cmd)}: {e}") from e
    if proc.returncode:
        raise AotError(f"linking failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")


def _forget_compiled_kernels() -> None:
    """Empty quack's in-memory caches of compiled GEMMs and their launch plans, so that the
    next build compiles and writes an object file. A helper forked from a process that had
    run the kernel through quack inherits them (loaded into that process's CUDA context, of
    no use here), and a build answered from them wrote nothing (on the H200: "expected one
    object file from quack's compile, found 0", data/reports/gpu/h200_1gpu_s16/session.log).
    A cache missing from this quack is passed over: the build then fails as before, and its
    kernel runs through quack's own path."""
    import quack.gemm
    import quack.gemm_interface
    import quack.gemm_runtime.host

    from .epilogues import silu_mul

    for owner, name in ((quack.gemm, "_compile_gemm"), (quack.gemm, "_gemm_plan_cache"),
                        (quack.gemm_runtime.host, "_compile_gemm_epi"),
                        (quack.gemm_interface, "_gemm_iface_plan_cache"),
                        (silu_mul, "_plan_cache"), (silu_mul, "_call_cache")):
        cache = getattr(owner, name, None)
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
        elif isinstance(cache, dict):
            cache.clear()


def build(key: str, make_plan, arguments=epi_plan_arguments) -> Path:
    """Compile with quack (``make_plan()`` returns the plan, built while quack's kernel cache
    points at a scratch folder, so its one object file is this kernel's), link, record the
    launch arguments (``arguments(plan)``: an EpiPlan's by default); the JSON file's path.
    Needs quack imported in a GPU-blind process (``compile.configure_gpu_blind``)."""
    import quack.cache as qcache
    from quack.cache.jit import EXPORT_FUNC_NAME

    so, meta = library_paths(key)
    so.parent.mkdir(parents=True, exist_ok=True)
    _forget_compiled_kernels()
    prev = qcache.CACHE_DIR
    with tempfile.TemporaryDirectory(prefix="cutetune-aot-") as tmp:
        qcache.CACHE_DIR = tmp
        try:
            plan = make_plan()
        finally:
            qcache.CACHE_DIR = prev
        objs = sorted(Path(tmp).rglob("*.o"))
        if len(objs) != 1:
            raise AotError(f"expected one object file from quack's compile, found {len(objs)}")
        args = arguments(plan)
        write_atomic(object_path(key), objs[0].read_bytes())
    _install(key, json.dumps({"format": FORMAT, "function": EXPORT_FUNC_NAME,
                              "library": so.name, **args}).encode())
    return meta


def _install(key: str, meta: bytes) -> None:
    """Link ``object_path(key)`` and write its launch arguments (last: the pair is complete)."""
    so, meta_path = library_paths(key)
    with replacing(so, "kernel library") as tmp_so:
        link(object_path(key), tmp_so)
    write_atomic(meta_path, meta)


# ---------------------------------------------------------------- shipped object files
def read_package(path: Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and the other entries of the kernel package at ``path`` (empty where there
    is none yet); OutputError naming it where it is not one (``prebuild --package`` reads it
    before building, so that a bad one costs no build)."""
    if not path.exists():
        return {"format": FORMAT, "environments": [], "kernels": {}}, {}
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read("manifest.json"))
            if not isinstance(manifest, dict):
                raise ValueError("its manifest.json is not an object")
            envs, kernels = manifest.get("environments"), manifest.get("kernels")
            if manifest.get("format") != FORMAT or not isinstance(envs, list) or not (
                    isinstance(kernels, dict) and all(
                        isinstance(k, dict) and isinstance(k.get("environment"), int)
                        and 0 <= k["environment"] < len(envs) for k in kernels.values())):
                raise ValueError(f"its manifest.json is not one of format {FORMAT} with "
                                 f"environments and kernels")
            return manifest, {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
    except (OSError, zipfile.BadZipFile, KeyError, TypeError, ValueError) as e:
        raise OutputError(f"kernel package {path} is not a cutetune kernel package "
                          f"({type(e).__name__}: {e}); move it away or give another "
                          f"--package") from None


def write_package(path: Path, specs: list[dict]) -> None:
    """Put the built kernels of ``specs`` (object files and launch arguments) in the zip at
    ``path``, beside what it holds from other environments (this one's are replaced); its
    manifest lists each environment and each kernel's spec, from which its key follows."""
    env = build_environment()
    manifest, entries = read_package(path)
    envs = [e for e in manifest["environments"] if e != env]
    kernels = {}
    for key, k in manifest["kernels"].items():
        old = manifest["environments"][k["environment"]]
        if old != env:
            kernels[key] = {**k, "environment": envs.index(old)}
    entries = {n: data for n, data in entries.items() if n.split(".")[0] in kernels}
    envs.append(env)
    for spec in specs:
        key = kernel_key(spec)
        kernels[key] = {"spec": spec, "environment": len(envs) - 1}
        entries[f"{key}.o"] = object_path(key).read_bytes()
        entries[f"{key}.json"] = library_paths(key)[1].read_bytes()
    manifest = {"format": FORMAT, "environments": envs, "kernels": kernels}
    with replacing(path, "kernel package") as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
            for name in sorted(entries):
                z.writestr(name, entries[name])


def install_packaged(key: str, package: Path) -> bool:
    """Link the package's object file for ``key`` into the library folder; False when the
    package does not hold it (another environment's key, or an unshipped kernel)."""
    if not package.exists():
        return False
    try:
        with zipfile.ZipFile(package) as z:
            if f"{key}.o" not in z.namelist():
                return False
            obj, meta = z.read(f"{key}.o"), z.read(f"{key}.json")
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise AotError(f"the prebuilt kernels {package} are unreadable: {e}") from e
    library_dir().mkdir(parents=True, exist_ok=True)
    write_atomic(object_path(key), obj)
    _install(key, meta)
    return True


# ---------------------------------------------------------------- running (tvm_ffi only)
class Library:
    """A loaded kernel: ``launch(a, b, d, c)`` with ``b`` as (K, N), quack's logical B, and
    ``d`` as the caller's output; ``swizzle``, where the library records where it goes, is the
    scheduler's swizzle to launch with."""

    def __init__(self, key: str, device, cluster_size: int, swizzle: int | None = None) -> None:
        so, meta_path = library_paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("format") != FORMAT:
                raise AotError(f"library format {meta.get('format')} is not {FORMAT}")
            import tvm_ffi

            self.fn = tvm_ffi.load_module(str(so))[meta["function"]]
            self.b_kn, self.swapped = meta["b_kn"], meta["swapped"]
            self.d_transposed = meta.get("d_transposed", False)
            tail = meta["tail"]
            if swizzle is not None and "swizzle_at" in meta:
                arg, field = meta["swizzle_at"]
                tail[arg][field] = swizzle
            self.tail = _fill(tail, lambda: max_active_clusters(device, cluster_size))
        except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError,
                AttributeError, ImportError) as e:
            raise AotError(f"{meta_path}: {type(e).__name__}: {e}") from e

    def launch(self, a, b, d, c) -> None:
        if not self.b_kn:
            b = b.mT
        if self.swapped:
            a, b = b, a
        if self.d_transposed:
            d, c = d.mT, None if c is None else c.mT
        self.fn(a, b, d, c, *self.tail)


def load(key: str, device, cluster_size: int, what: str,
         swizzle: int | None = None) -> Library | None:
    """The library ``key`` when it is built (or linked from prebuilt objects) and loads, else
    None: the caller launches through quack instead. One that does not load is reported
    (naming ``what`` kernel it holds) and its launch arguments are removed, so the next build
    makes it again (a library links cutlass's runtime by absolute path: an environment
    recreated elsewhere leaves it dangling)."""
    if not ensure_library(key):
        return None
    try:
        return Library(key, device, cluster_size, swizzle)
    except AotError as e:
        log.warning("cutetune: %s's library did not load (%s); using quack", what, e)
        with contextlib.suppress(OSError):
            library_paths(key)[1].unlink()
        return None


def launch_from_library(plan, make_run, args: tuple, what: str) -> bool:
    """A first launch from a library: run ``args`` through ``make_run()`` (a library's
    ``run``, None where it is not built or does not load) and keep that ``run`` on ``plan``
    (with ``via`` "library"). False where there is none or it failed (logged, naming ``what``
    kernel): the caller then launches through quack."""
    try:
        run = make_run()
        if run is not None:
            run(*args)
            plan.run, plan.via = run, "library"
            return True
    except Exception as e:  # noqa: BLE001
        log.warning("cutetune: %s's library failed (%s: %s); using quack", what,
                    type(e).__name__, e)
    return False


def _fill(value, clusters):
    """The recorded arguments as tuples, the cluster sentinel replaced by ``clusters()``."""
    if isinstance(value, list):
        return tuple(_fill(v, clusters) for v in value)
    return clusters() if value == CLUSTERS_SENTINEL else value


_PROBE_PTX = b"""
.version 7.8
.target sm_90
.address_size 64
.visible .entry cutetune_occupancy_probe() { ret; }
\0"""


@lru_cache(maxsize=None)
def max_active_clusters(device, cluster_size: int) -> int:
    """How many clusters of ``cluster_size`` CTAs (one per SM, all of its shared memory) run at
    once on ``device``: the CUDA driver's occupancy query on an empty kernel, as cutlass's
    ``HardwareInfo.get_max_active_clusters`` asks it for quack's persistent schedulers."""
    import torch
    from cuda.bindings import driver as cu

    def check(result):
        err, *rest = result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise AotError(f"CUDA driver error {err} in the occupancy query")
        return rest[0] if len(rest) == 1 else rest

    with torch.cuda.device(device):
        torch.cuda.init()
        torch.empty(1, device=device)  # the primary context is current on this thread
        dev = check(cu.cuCtxGetDevice())
        module = check(cu.cuModuleLoadData(_PROBE_PTX))
        try:
            fn = check(cu.cuModuleGetFunction(module, b"cutetune_occupancy_probe"))
            optin = check(cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev))
            check(cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                optin))
            smem = check(cu.cuOccupancyAvailableDynamicSMemPerBlock(fn, 1, 1))
            blocks = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 1, smem))
            check(cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1))
            config = cu.CUlaunchConfig()
            config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
            config.sharedMemBytes = smem
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            value = cu.CUlaunchAttributeValue()
            value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster_size, 1, 1
            attr.value = value
            config.numAttrs, config.attrs = 1, [attr]
            config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, blocks, 1
            return int(check(cu.cuOccupancyMaxActiveClusters(fn, config)))
        finally:
            cu.cuModuleUnload(module)
