"""Peak memory bandwidth of known GPUs, looked up from a trace's ``deviceProperties``.

Kineto writes each device's ``name``, ``totalGlobalMem`` (bytes), ``computeMajor``/``computeMinor`` and
``numSms`` into the trace, but no memory clock or bus width, so the NVML formula of
:func:`.hardware.nvml_peak_GBps` cannot be applied to someone else's trace. Instead the device is matched by
name against :data:`KNOWN_GPUS`, each entry's peak copied from the vendor's datasheet (named in ``source``);
where one name covers boards of different bandwidth (A100 40 GB / 80 GB), the memory size decides, and where
even that cannot (an "H100" without PCIe, SXM/HBM3 or NVL in its name: 2.0, 3.35 or 3.9 TB/s), the lookup
says so instead of guessing. GB/s are 10^9 bytes per second, as the datasheets count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class KnownGpu:
    """One row of the table: devices whose lower-cased name matches ``pattern`` (a regex searched in it) and,
    when given, whose memory is in [``min_memory_GB``, ``max_memory_GB``) (10^9 bytes) have ``peak_GBps``."""

    label: str
    pattern: str
    peak_GBps: float
    source: str
    min_memory_GB: float | None = None
    max_memory_GB: float | None = None

    def matches(self, name: str, memory_bytes: float | None) -> bool:
        """Whether a device of ``name`` and ``memory_bytes`` (None: unknown) is this entry."""
        if not re.search(self.pattern, name.lower()):
            return False
        if self.min_memory_GB is None and self.max_memory_GB is None:
            return True
        if memory_bytes is None:
            return False
        gb = memory_bytes / GB
        return (self.min_memory_GB is None or gb >= self.min_memory_GB) and (
            self.max_memory_GB is None or gb < self.max_memory_GB)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_A800 = "NVIDIA A800 Tensor Core GPU datasheet"
_MI300 = "AMD Instinct MI300 series datasheet"
# In order: the first matching entry wins, so the qualified names come before the bare ones. Totals of
# memory as CUDA reports them: an A100 40GB has 42.3e9 bytes, an 80GB 85.1e9; a GH200 96 GB about 102e9.
KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu("B200", r"\bb200\b", 8000.0, "NVIDIA HGX B200 datasheet: 8 TB/s HBM3e per GPU"),
    KnownGpu("H200 NVL", r"\bh200\b.*\bnvl\b", 4800.0, f"{_H200}: H200 NVL 4.8 TB/s"),
    KnownGpu("H200 SXM", r"\bh200\b", 4800.0, f"{_H200}: H200 SXM 4.8 TB/s"),
    KnownGpu("GH200 96 GB HBM3", r"\bgh200\b", 4000.0, "NVIDIA GH200 Grace Hopper Superchip datasheet: 96 GB "
             "HBM3, 4 TB/s", max_memory_GB=120.0),
    KnownGpu("GH200 144 GB HBM3e", r"\bgh200\b", 4900.0, "NVIDIA GH200 Grace Hopper Superchip datasheet: 144 GB "
             "HBM3e, 4.9 TB/s", min_memory_GB=130.0),
    KnownGpu("H20", r"\bh20\b", 4000.0, "NVIDIA H20 datasheet: 96 GB HBM3, 4.0 TB/s", max_memory_GB=120.0),
    KnownGpu("H800 PCIe", r"\bh800\b.*\bpcie\b", 2000.0, "NVIDIA H800 PCIe datasheet: 2 TB/s"),
    KnownGpu("H800 SXM", r"\bh800\b", 3350.0, "NVIDIA H800 SXM5 datasheet: 3.35 TB/s"),
    KnownGpu("H100 NVL", r"\bh100\b.*\bnvl\b", 3900.0, f"{_H100}: H100 NVL 3.9 TB/s"),
    KnownGpu("H100 PCIe", r"\bh100\b.*\bpcie\b", 2000.0, f"{_H100}: H100 PCIe 2 TB/s"),
    KnownGpu("H100 SXM", r"\bh100\b.*(\bsxm|\bhbm3\b)", 3350.0, f"{_H100}: H100 SXM 3.35 TB/s"),
    KnownGpu("A100 40GB", r"\ba100\b", 1555.0, f"{_A100}: A100 40GB PCIe and SXM 1,555 GB/s", max_memory_GB=60.0),
    KnownGpu("A100 80GB PCIe", r"\ba100\b.*\bpcie\b", 1935.0, f"{_A100}: A100 80GB PCIe 1,935 GB/s",
             min_memory_GB=60.0),
    KnownGpu("A100 80GB SXM", r"\ba100\b.*\bsxm", 2039.0, f"{_A100}: A100 80GB SXM 2,039 GB/s", min_memory_GB=60.0),
    KnownGpu("A800 40GB", r"\ba800\b", 1555.0, f"{_A800}: A800 40GB PCIe 1,555 GB/s", max_memory_GB=60.0),
    KnownGpu("A800 80GB PCIe", r"\ba800\b.*\bpcie\b", 1935.0, f"{_A800}: A800 80GB PCIe 1,935 GB/s",
             min_memory_GB=60.0),
    KnownGpu("A800 80GB SXM", r"\ba800\b.*\bsxm", 2039.0, f"{_A800}: A800 80GB SXM 2,039 GB/s", min_memory_GB=60.0),
    KnownGpu("A30", r"\ba30\b", 933.0, "NVIDIA A30 Tensor Core GPU datasheet: 933 GB/s"),
    KnownGpu("A40", r"\ba40\b", 696.0, "NVIDIA A40 datasheet: 696 GB/s"),
    KnownGpu("A10", r"\ba10\b", 600.0, "NVIDIA A10 Tensor Core GPU datasheet: 600 GB/s"),
    KnownGpu("L40S", r"\bl40s\b", 864.0, "NVIDIA L40S datasheet: 864 GB/s"),
    KnownGpu("L40", r"\bl40\b", 864.0, "NVIDIA L40 datasheet: 864 GB/s"),
    KnownGpu("L4", r"\bl4\b", 300.0, "NVIDIA L4 Tensor Core GPU datasheet: 300 GB/s"),
    KnownGpu("T4", r"\bt4\b", 320.0, "NVIDIA T4 Tensor Core GPU datasheet: 320 GB/s"),
    KnownGpu("V100S", r"\bv100s\b", 1134.0, "NVIDIA V100 Tensor Core GPU datasheet: V100S PCIe 1,134 GB/s"),
    KnownGpu("V100", r"\bv100\b", 900.0, "NVIDIA V100 Tensor Core GPU datasheet: V100 SXM2 and PCIe 900 GB/s"),
    KnownGpu("RTX 6000 Ada", r"\brtx 6000 ada\b", 960.0, "NVIDIA RTX 6000 Ada Generation datasheet: 960 GB/s"),
    KnownGpu("RTX A6000", r"\brtx a6000\b", 768.0, "NVIDIA RTX A6000 datasheet: 768 GB/s"),
    # a laptop part of the same number has half the bus (RTX 4090 Laptop 576 GB/s, 5090 Laptop 896 GB/s) and a Ti
    # faster memory (RTX 3090 Ti 1,008 GB/s): neither is the desktop card's figure
    KnownGpu("GeForce RTX 4090", r"\brtx 4090\b(?!.*\blaptop\b)", 1008.0,
             "NVIDIA GeForce RTX 4090 specifications: 1,008 GB/s"),
    KnownGpu("GeForce RTX 5090", r"\brtx 5090\b(?!.*\blaptop\b)", 1792.0,
             "NVIDIA GeForce RTX 5090 specifications: 1,792 GB/s"),
    KnownGpu("GeForce RTX 3090", r"\brtx 3090\b(?! ?ti\b)", 936.0,
             "NVIDIA GeForce RTX 3090 specifications: 936 GB/s"),
    KnownGpu("Instinct MI325X", r"\bmi325x\b", 6000.0, "AMD Instinct MI325X datasheet: 6 TB/s"),
    KnownGpu("Instinct MI300X", r"\bmi300x\b", 5300.0, f"{_MI300}: MI300X 5.3 TB/s"),
    # ROCm shows each of an MI250X's two dies (GCDs) as a device of its own, 64 GB with half the module's bandwidth
    KnownGpu("Instinct MI250X", r"\bmi250x\b", 1638.4, "AMD Instinct MI250X datasheet: 3.2 TB/s (3,276.8 GB/s) "
             "a module of two GCDs, each a device of 64 GB: 1,638.4 GB/s"),
)

# Names the table knows only with a qualifier it needs; without one the peak is ambiguous, not unknown.
_AMBIGUOUS = ((r"\bh100\b", "an H100 is 2.0 TB/s (PCIe), 3.35 TB/s (SXM) or 3.9 TB/s (NVL) by NVIDIA's "
                            "datasheet, and the name does not say which"),
              (r"\ba100\b", "an 80 GB A100 is 1,935 GB/s (PCIe) or 2,039 GB/s (SXM) by NVIDIA's datasheet, and "
                            "the name does not say which"),
              (r"\ba800\b", "an 80 GB A800 is 1,935 GB/s (PCIe) or 2,039 GB/s (SXM) by NVIDIA's datasheet, and "
                            "the name does not say which"),
              (r"\bh20\b", "an H20 of 96 GB is 4.0 TB/s by NVIDIA's datasheet; the memory size reported is not "
                           "that one's"),
              (r"\bgh200\b", "a GH200's HBM is 96 GB (4 TB/s) or 144 GB (4.9 TB/s), and the memory size reported "
                             "fits neither"))


def device_properties(metadata: dict, device: int | None) -> dict | None:
    """The ``deviceProperties`` entry of ``device`` in a trace's top-level ``metadata`` (the first entry when
    ``device`` is None or not listed but every entry has the same name), as ``{"name", "total_memory_bytes",
    "sm_count", "compute_capability"}`` (None where absent or not of its kind: a name that is not a string, a memory
    size that is not a number of bytes in (0, 2**64)); None when the trace lists no device."""
    props = metadata.get("deviceProperties") if isinstance(metadata, dict) else None
    entries = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    if not entries:
        return None
    chosen = next((p for p in entries if device is not None and p.get("id") == device), None)
    if chosen is None:
        if len({str(p.get("name")) for p in entries}) != 1:
            return None
        chosen = entries[0]
    memory = chosen.get("totalGlobalMem")
    major, minor = chosen.get("computeMajor"), chosen.get("computeMinor")
    name = chosen.get("name")
    # a size CUDA reports (size_t) is a whole number of bytes below 2**64; Infinity, NaN or 1e400 are not one
    sized = isinstance(memory, (int, float)) and not isinstance(memory, bool) and 0 < memory < 2 ** 64
    return {"name": name if isinstance(name, str) and name else None,
            "total_memory_bytes": int(memory) if sized else None,
            "sm_count": chosen.get("numSms") if isinstance(chosen.get("numSms"), int) else None,
            "compute_capability": f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None}


def lookup_peak(name: str | None, memory_bytes: float | None) -> dict:
    """Datasheet peak of a device named ``name`` with ``memory_bytes`` of memory (None: unknown).

    Returns:
        ``{"peak_GBps": float, "label": str, "source": str, "reason": None}`` for a match in
        :data:`KNOWN_GPUS`, else ``{"peak_GBps": None, "label": None, "source": None, "reason": str}`` saying
        why (no name, not in the table, or ambiguous).
    """
    if not name:
        return {"peak_GBps": None, "label": None, "source": None, "reason": "the trace names no GPU"}
    for gpu in KNOWN_GPUS:
        if gpu.matches(name, memory_bytes):
            return {"peak_GBps": gpu.peak_GBps, "label": gpu.label, "source": gpu.source, "reason": None}
    for pattern, why in _AMBIGUOUS:
        if re.search(pattern, name.lower()):
            return {"peak_GBps": None, "label": None, "source": None, "reason": f"{name}: {why}"}
    return {"peak_GBps": None, "label": None, "source": None,
            "reason": f"{name} is not in bubblescope's table of known GPUs"}
