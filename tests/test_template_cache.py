"""cutetune's persistent cache of Triton template kernels: real Triton compiles for sm90 on the
CPU, each into its own Triton cache as a fresh Inductor cache would give it."""

import json
import logging
import os

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cutetune.tuner.inductor import template_cache
from cutetune.tuner.inductor.template_cache import MANAGER, TemplateKernelCache, stored_templates


@triton.jit
def triton_tem_double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


@triton.jit
def triton_poi_double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """A store, and a function that compiles ``fn`` for sm90 into a fresh Triton cache."""
    monkeypatch.setenv("CUTETUNE_TEMPLATE_CACHE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    monkeypatch.setattr(TemplateKernelCache, "loads", 0)
    monkeypatch.setattr(TemplateKernelCache, "stores", 0)
    runs = iter(range(100))

    def compile_fresh(fn):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"triton{next(runs)}"))
        src = ASTSource(fn=fn, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                          "BLOCK": "constexpr"}, constexprs={"BLOCK": 128})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32))

    return tmp_path / "store", compile_fresh


def test_a_template_compiled_once_loads_from_the_store_into_a_fresh_triton_cache(caches):
    store, compile_fresh = caches
    first = compile_fresh(triton_tem_double)
    assert (TemplateKernelCache.stores, TemplateKernelCache.loads) == (1, 0)
    assert stored_templates() == 1
    second = compile_fresh(triton_tem_double)
    assert (TemplateKernelCache.stores, TemplateKernelCache.loads) == (1, 1)
    assert second.hash == first.hash and second.asm["cubin"] == first.asm["cubin"]
    # copied into the fresh Triton cache, where Inductor's static launcher looks for the cubin
    local = os.path.join(os.environ["TRITON_CACHE_DIR"], os.listdir(os.environ["TRITON_CACHE_DIR"])[0])
    assert "triton_tem_double.cubin" in os.listdir(local)


def test_other_kernels_stay_in_tritons_cache_only(caches):
    store, compile_fresh = caches
    compile_fresh(triton_poi_double)
    compile_fresh(triton_poi_double)
    assert (TemplateKernelCache.stores, TemplateKernelCache.loads) == (0, 0)
    assert stored_templates() == 0


def test_an_incomplete_or_corrupt_entry_is_compiled_again(caches, caplog):
    store, compile_fresh = caches
    compile_fresh(triton_tem_double)
    (group,) = store.glob("*/__grp__triton_tem_double.json")
    group.unlink()  # files without their group: a store interrupted mid-write
    compile_fresh(triton_tem_double)
    assert (TemplateKernelCache.stores, TemplateKernelCache.loads) == (2, 0)
    group.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=template_cache.__name__):
        again = compile_fresh(triton_tem_double)
    assert TemplateKernelCache.loads == 0 and "unreadable entry" in caplog.text
    assert again.asm["cubin"]
    names = json.loads(group.read_text())["files"]  # the recompile rewrote the entry whole
    assert "triton_tem_double.cubin" in names


def test_an_unwritable_store_leaves_the_compile_to_tritons_cache(caches, caplog, monkeypatch,
                                                                  tmp_path):
    _, compile_fresh = caches
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("CUTETUNE_TEMPLATE_CACHE_DIR", str(blocker / "store"))
    with caplog.at_level(logging.WARNING, logger=template_cache.__name__):
        kernel = compile_fresh(triton_tem_double)
    assert kernel.asm["cubin"] and "cannot store triton_tem_double.json" in caplog.text
    assert TemplateKernelCache.stores == 0


def test_enable_installs_the_manager_until_disabled_and_leaves_a_users_own(monkeypatch):
    from cutetune.tuner.inductor import enable

    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    with enable("predicted"):
        assert os.environ["TRITON_CACHE_MANAGER"] == MANAGER
        with enable("off"):
            assert os.environ["TRITON_CACHE_MANAGER"] == MANAGER
        with enable("reduced", prefetch=False):
            assert os.environ["TRITON_CACHE_MANAGER"] == MANAGER
        assert os.environ["TRITON_CACHE_MANAGER"] == MANAGER
    assert "TRITON_CACHE_MANAGER" not in os.environ
    users = "triton.runtime.cache:FileCacheManager"
    monkeypatch.setenv("TRITON_CACHE_MANAGER", users)
    with enable("predicted"):
        assert os.environ["TRITON_CACHE_MANAGER"] == users
    assert os.environ["TRITON_CACHE_MANAGER"] == users
