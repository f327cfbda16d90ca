"""A kernel configuration of quack's CuteDSL GEMM, with quack's GemmConfig field names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

ARCH_CAPACITY = {"sm90": 9, "sm100": 10}


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
    def from_dict(cls, d: dict) -> "KernelConfig":
        """Build from a mapping with quack's field names; missing fields take quack's defaults,
        unknown fields are an error (a typo must not silently become a default)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names - {"device_capacity", "tile_k", "num_warps", "cluster_k",
                                     "use_tma_gather"}
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}; "
                             f"expected a subset of {', '.join(sorted(names))}")
        kw = {}
        for f in fields(cls):
            if f.name in d:
                v = d[f.name]
                kw[f.name] = bool(v) if f.type in ("bool", bool) else int(v)
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


def quack_default_config(arch: str) -> KernelConfig:
    """quack's per-arch default (quack.gemm_config._default_config_for_cap), as ours."""
    if arch == "sm90":
        return KernelConfig(128, 192, True, 2, 1, False, 8, 1, False)
    return KernelConfig(256, 256, False, 2, 1, False, 8, 1, True)
