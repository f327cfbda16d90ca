"""The GPUs cutetune tunes for: the few numbers the derived features need from a device.

Features are computed for a device, not an arch, because the same kernel tiles an H100's
132 SMs and a B200's 148 differently (waves, last-wave occupancy) and meets different
compute and bandwidth ceilings (the roofline time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    arch: str  # "sm90" or "sm100", as in GemmProblem.arch
    sm_count: int
    smem_per_sm_bytes: int
    l2_bytes: int
    # Dense (no sparsity) tensor-core rate per input dtype, TFLOP/s. Left out of the hash: a
    # dict is unhashable, and name already identifies the spec.
    peak_tflops: dict[str, float] = field(hash=False)
    mem_bw_tbps: float
    memory_gib: int  # datasheet capacity, read as GiB: at least what a tensor can take
    max_cluster_size: int = 8  # portable cluster size (16 needs a non-portable opt-in)

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s for ``dtype`` inputs."""
        try:
            return self.peak_tflops[dtype] * 1e12
        except KeyError:
            raise ValueError(f"{self.name} has no peak rate for dtype {dtype!r}; known: "
                             f"{', '.join(sorted(self.peak_tflops))}") from None

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_tbps * 1e12


H100_SXM = DeviceSpec(
    name="H100_SXM", arch="sm90", sm_count=132, smem_per_sm_bytes=228 * KIB, l2_bytes=50 * MIB,
    peak_tflops={"bf16": 989.0, "fp16": 989.0}, mem_bw_tbps=3.35, memory_gib=80,
)
"""H100 SXM5 80 GB, datasheet rates (torch names it 'NVIDIA H100 80GB HBM3')."""

H200 = DeviceSpec(
    name="H200", arch="sm90", sm_count=132, smem_per_sm_bytes=228 * KIB, l2_bytes=60 * MIB,
    peak_tflops={"bf16": 790.0, "fp16": 790.0}, mem_bw_tbps=4.3, memory_gib=141,
)
"""H200 SXM 141 GB. The rates are MEASURED ceilings from the project's H200 machine notes
(/work/.library/device/KINDS.md, 2026-10-28 and 2026-11-04): an 8192^3 bf16 torch.matmul on
random data ran at 769-798 TFLOP/s and a device-to-device copy moved ~4.3 TB/s (read + write).
The datasheet says 989 TFLOP/s and 4.8 TB/s; the roofline uses what was reached there (no
result file in this repo holds these runs yet). L2 is 60 MB as torch reported it there."""

B200 = DeviceSpec(
    name="B200", arch="sm100", sm_count=148, smem_per_sm_bytes=228 * KIB, l2_bytes=126 * MIB,
    peak_tflops={"bf16": 2250.0, "fp16": 2250.0}, mem_bw_tbps=8.0, memory_gib=180,
)
"""B200, datasheet rates (dense bf16 ~2.25 PFLOP/s, HBM3e 8 TB/s, 180 GB as in HGX B200);
not measured here."""

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H100_SXM, H200, B200)}

# Spellings -> spec: our names, torch.cuda.get_device_name() strings, and arches (an arch
# picks the device we measure on: sm90 -> H200, sm100 -> B200). Matching ignores case. Other
# variants (H100 PCIe: 114 SMs, H200 NVL, ...) differ in SM count or clocks: refused, not guessed.
SPELLINGS: dict[str, DeviceSpec] = {
    "H100_SXM": H100_SXM, "H100": H100_SXM, "NVIDIA H100 80GB HBM3": H100_SXM,
    "H200": H200, "NVIDIA H200": H200,
    "B200": B200, "NVIDIA B200": B200,
    "sm90": H200, "sm100": B200,
}
_BY_LOWER = {k.lower(): v for k, v in SPELLINGS.items()}


def device_for(name_or_arch: str) -> DeviceSpec:
    """The spec for a device name (ours or torch's) or an arch; ValueError for anything else."""
    spec = _BY_LOWER.get(str(name_or_arch).strip().lower())
    if spec is None:
        raise ValueError(f"unknown device {name_or_arch!r}; known: {', '.join(SPELLINGS)}")
    return spec


def largest_memory(arch: str) -> DeviceSpec:
    """The listed ``arch`` device with the most memory: what bounds a problem's operands."""
    return max((d for d in DEVICES.values() if d.arch == arch), key=lambda d: d.memory_gib)
