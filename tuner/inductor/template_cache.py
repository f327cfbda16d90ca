"""A persistent copy of the Triton GEMM template kernels that cutetune's choices compile.

Inductor keeps Triton's cache inside its own cache folder, so with a cold Inductor cache every
template kernel that cutetune gave a GEMM compiles again, on the critical path of a warm
compile. ``TemplateKernelCache`` is a Triton cache manager
(``TRITON_CACHE_MANAGER``) that also keeps the kernels Inductor names ``triton_tem_*`` in
cutetune's cache folder (``settings.template_cache_dir``), and copies them back into Triton's cache on a miss
there. Every other kernel (pointwise, reductions, launcher modules) is cached as without
cutetune, so a warm compile still compiles what the default compiles. Entries are keyed by
Triton's own hash of source, options, backend and compiler version, so a hit is the kernel
that compiling would have produced.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from triton.runtime.cache import FileCacheManager

from ...artifacts import write_atomic
from ...settings import template_cache_dir

log = logging.getLogger(__name__)

TEMPLATE_PREFIX = "triton_tem_"  # Inductor's name for a template kernel in output code
MANAGER = f"{__name__}:TemplateKernelCache"
ENV = "TRITON_CACHE_MANAGER"
_GROUP = "__grp__"


class TemplateKernelCache(FileCacheManager):
    """Triton's file cache plus a second store for template kernels.

    ``loads`` and ``stores`` count this process's template kernels taken from and put into the
    store (Inductor compiles in worker processes unless compile_threads is 1)."""

    loads = 0
    stores = 0

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self.store = None if override or dump else template_cache_dir() / key

    def _kept(self, filename: str) -> bool:
        return self.store is not None and filename.startswith(TEMPLATE_PREFIX)

    def get_group(self, filename: str):
        group = super().get_group(filename)
        if group is not None or not self._kept(filename):
            return group
        try:
            names = json.loads((self.store / f"{_GROUP}{filename}").read_text())["files"]
            local = {name: self.put((self.store / name).read_bytes(), name) for name in names}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cutetune template cache: unreadable entry %s (%s); compiling it",
                        self.store, e)
            return None
        super().put_group(filename, local)
        type(self).loads += 1
        return local

    def put_group(self, filename: str, group: dict[str, str]):
        path = super().put_group(filename, group)
        if self._kept(filename):
            try:
                self.store.mkdir(parents=True, exist_ok=True)
                for name, src in group.items():
                    write_atomic(self.store / name, Path(src).read_bytes())
                # the group last: an entry is complete once its group names its files
                write_atomic(self.store / f"{_GROUP}{filename}",
                              json.dumps({"files": sorted(group)}).encode())
                type(self).stores += 1
            except OSError as e:
                log.warning("cutetune template cache: cannot store %s in %s (%s); the kernel "
                            "stays in Triton's cache only", filename, self.store, e)
        return path


def stored_templates() -> int:
    """How many complete template kernels the store holds."""
    return sum(1 for _ in template_cache_dir().glob(f"*/{_GROUP}{TEMPLATE_PREFIX}*"))


def install() -> str | None:
    """Make Triton (here and in compile workers started from now on) use the template cache.
    Returns the value to restore with ``uninstall``; a manager the user set is left alone."""
    prev = os.environ.get(ENV)
    if prev not in (None, MANAGER):
        log.info("cutetune template cache off: %s=%s is set", ENV, prev)
        return prev
    os.environ[ENV] = MANAGER
    return prev


def uninstall(prev: str | None) -> None:
    if prev is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = prev
