"""A kernel configuration of quack's CuteDSL GEMM, with quack's GemmConfig field names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from numbers import Integral

import numpy as np

ARCH_CAPACITY = {"sm90": 9, "sm100": 10}
# quack GemmConfig fields cutetune does not tune, and the value every kernel it runs has
# (``to_quack`` leaves them at quack's defaults).
QUACK_FIXED = {"tile_k": None, "num_warps": None, "cluster_k": 1, "use_tma_gather": False}


def _is_int(v) -> bool:
    return type(v) is int or isinstance(v, Integral) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True, order=True)
class KernelConfig:
    tile_m: int = 128
    tile_n: int = 192
    pingpong: bool = True
    cluster_m: int = 2
    cluster_n: int = 1
    swap_ab: bool = False
    max_swizzle_size: int = 8
    split_k: int = 1
    is_dynamic_persistent: bool = False

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    def compile_key(self) -> "KernelConfig":
        """The config with its run-time-only knobs normalized: configs with one compile key
        share one compiled kernel (max_swizzle_size is a scheduler argument, not traced)."""
        return replace(self, max_swizzle_size=0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, arch: str | None = None) -> "KernelConfig":
        """Build from a mapping with quack's field names; missing fields take quack's defaults.
        Strict, since a config read loosely is a different kernel ranked or run without a
        word: integers must be integers (not 128.9, not "128"), flags true/false (or 0/1),
        unknown fields are an error (a typo must not become a default), and quack's fields
        that cutetune does not tune must hold the value cutetune runs (QUACK_FIXED); given
        ``arch``, device_capacity must be that arch's."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a config is an object of fields, got {type(d).__name__}")
        unknown = set(d) - _IS_FLAG.keys() - QUACK_FIXED.keys() - {"device_capacity"}
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}; "
                             f"expected a subset of {', '.join(sorted(_IS_FLAG))}")
        for name, runs in QUACK_FIXED.items():
            if name in d and (d[name] != runs or type(d[name]) is not type(runs)):
                raise ValueError(f"{name}={d[name]!r}: cutetune does not tune {name} (its kernels "
                                 f"run quack's default, {runs!r}); leave it out")
        if "device_capacity" in d:
            cap = d["device_capacity"]
            ok = ARCH_CAPACITY.values() if arch is None else (ARCH_CAPACITY[arch],)
            if not _is_int(cap) or cap not in ok:
                raise ValueError(f"device_capacity={cap!r} is not "
                                 + (f"{arch}'s ({ARCH_CAPACITY[arch]})" if arch else
                                    f"one of {sorted(ARCH_CAPACITY.values())}"))
        kw = {}
        for name, flag in _IS_FLAG.items():
            if name not in d:
                continue
            v = d[name]
            if flag:
                if not (isinstance(v, (bool, np.bool_)) or _is_int(v) and v in (0, 1)):
                    raise ValueError(f"{name} must be true or false, got {v!r}")
                kw[name] = bool(v)
            else:
                if not _is_int(v):
                    raise ValueError(f"{name} must be an integer, got {v!r}")
                kw[name] = int(v)
        return cls(**kw)

    def to_quack(self, arch: str):
        """The equivalent ``quack.gemm_config.GemmConfig`` (imports quack lazily)."""
        from quack.gemm_config import GemmConfig

        return GemmConfig(
            tile_m=self.tile_m,
            tile_n=self.tile_n,
            pingpong=self.pingpong,
            is_dynamic_persistent=self.is_dynamic_persistent,
            cluster_m=self.cluster_m,
            cluster_n=self.cluster_n,
            split_k=self.split_k,
            swap_ab=self.swap_ab,
            max_swizzle_size=self.max_swizzle_size,
            device_capacity=ARCH_CAPACITY[arch],
        )

    def short(self) -> str:
        mode = "pp" if self.pingpong else "co"
        s = f"{self.tile_m}x{self.tile_n}{mode}_c{self.cluster_m}x{self.cluster_n}"
        s += f"_sw{self.max_swizzle_size}"
        if self.swap_ab:
            s += "_swap"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.is_dynamic_persistent:
            s += "_dyn"
        return s


_IS_FLAG = {f.name: f.type in ("bool", bool) for f in fields(KernelConfig)}


def quack_default_config(arch: str) -> KernelConfig:
    """quack's per-arch default (quack.gemm_config._default_config_for_cap), as ours."""
    if arch == "sm90":
        return KernelConfig(128, 192, True, 2, 1, False, 8, 1, False)
    return KernelConfig(256, 256, False, 2, 1, False, 8, 1, True)
