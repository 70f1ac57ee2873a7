"""Residency of a persistent kernel: how many of its programs (CTAs) an SM holds, and the grid that keeps all of
them resident — a correctness condition, since programs spin on each other (the H200 probe deadlocked at 8
programs per SM). Shared by both kernel implementations (``triton_kernel``, ``gluon``).

Counts: registers (allocated per warp in units of 256), threads, shared memory (plus 1 KB the runtime reserves
per block on sm_80+) and the per-SM block limit (CUDA C Programming Guide, "Technical Specifications per
Compute Capability").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import EngineUnavailable

REG_ALLOC_UNIT = 256            # registers are allocated per warp in units of 256 (sm_50 .. sm_90)
SMEM_RESERVED_PER_BLOCK = 1024  # bytes the CUDA runtime reserves per resident block (sm_80+)
# Maximum resident blocks per SM by compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"); 32 elsewhere from sm_50 to sm_90.
MAX_BLOCKS_PER_SM = {(7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24, (12, 0): 32}



@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM limits of a CUDA device (from ``torch.cuda.get_device_properties``)."""

    name: str
    sms: int
    regs_per_sm: int
    max_threads_per_sm: int
    smem_per_sm: int
    max_blocks_per_sm: int
    capability: tuple[int, int]


def device_limits(device: torch.device) -> DeviceLimits:
    p = torch.cuda.get_device_properties(device)
    cc = (p.major, p.minor)
    return DeviceLimits(
        name=p.name, sms=p.multi_processor_count, regs_per_sm=getattr(p, "regs_per_multiprocessor", 65536),
        max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", 2048),
        smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", 228 * 1024),
        max_blocks_per_sm=MAX_BLOCKS_PER_SM.get(cc, 32), capability=cc)


def programs_per_sm(n_regs: int, num_warps: int, shared_bytes: int, limits: DeviceLimits) -> tuple[int, dict]:
    """How many programs of a compiled kernel can be resident on one SM, and each limit's count.

    Registers: ``ceil(n_regs · 32 / 256) · 256`` per warp, ``regs_per_sm // that`` warps, over
    ``num_warps`` per program. Threads: ``max_threads_per_sm // (32 · num_warps)``. Shared memory:
    ``smem_per_sm // (shared_bytes + 1 KB)``. Blocks: the per-SM block limit.
    """
    regs_per_warp = -(-max(1, n_regs) * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by = {
        "registers": (limits.regs_per_sm // regs_per_warp) // num_warps,
        "threads": limits.max_threads_per_sm // (32 * num_warps),
        "shared_memory": limits.smem_per_sm // (shared_bytes + SMEM_RESERVED_PER_BLOCK),
        "blocks": limits.max_blocks_per_sm,
    }
    return min(by.values()), by


def size_grid(info: dict, limits: DeviceLimits, programs_per_sm_wanted: int, num_programs: int | None = None) -> dict:
    """Grid for a compiled kernel (``info`` from :meth:`Launcher.compile`) such that all programs are resident.

    Returns ``{"grid", "programs_per_sm", "fit_programs_per_sm", "residency_limits"}``: ``min(wanted, fit)``
    programs per SM on every SM, or exactly ``num_programs`` when given.

    Raises:
        EngineUnavailable: not even one program fits per SM, or ``num_programs`` exceeds what fits.
    """
    fit, by = programs_per_sm(info["registers"], info["num_warps"], info["shared_bytes"], limits)
    if fit < 1:
        raise EngineUnavailable(f"megakernel: not even one program fits per SM (limits {by}; registers "
                                f"{info['registers']}, shared {info['shared_bytes']} B, {info['num_warps']} warps)")
    if num_programs:
        if num_programs > fit * limits.sms:
            raise EngineUnavailable(f"megakernel: num_programs={num_programs} exceeds the {fit * limits.sms} "
                                    f"programs that can be resident (limits per SM {by})")
        return {"grid": num_programs, "programs_per_sm": -(-num_programs // limits.sms), "fit_programs_per_sm": fit,
                "residency_limits": by}
    pps = min(programs_per_sm_wanted, fit)
    return {"grid": pps * limits.sms, "programs_per_sm": pps, "fit_programs_per_sm": fit, "residency_limits": by}


def ptxas_usage(ptx: str, arch: int = 90) -> dict:
    """Registers and spill-store bytes of ``ptx`` as Triton's bundled ``ptxas -v`` reports them for ``sm_{arch}``
    (no GPU needed): ``{"registers", "spill_store_bytes", "ptxas_log"}``.

    Raises:
        subprocess.CalledProcessError: ptxas rejects the PTX.
    """
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", f.name,
                              "-o", "/dev/null"], capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spills.group(1)) if spills else None, "ptxas_log": log.strip()}


def cubin_text_bytes(cubin: bytes) -> dict:
    """Bytes of machine code per kernel in a CUDA ELF ``cubin`` (Triton's ``compiled.asm["cubin"]``): the size of
    each ``.text.<kernel>`` section, ``{kernel: bytes}`` (SASS instructions are 16 bytes each on sm_70+).

    Why: a megakernel runs every task type's code within one layer, so its hot code is the whole kernel, and its
    size is weighed against the SM's instruction cache (instruction fetch stalls measured in
    ``benchmarks/results/h200-2026-12-02-s12/ncu_default.csv``). Read from the ELF64 section headers
    (System V gABI: ``e_shoff`` at byte 0x28, ``e_shentsize`` / ``e_shnum`` / ``e_shstrndx`` at 0x3A–0x3F; a 64-byte
    section header holds ``sh_name`` at 0 and ``sh_size`` at 32); ``cuobjdump -elf`` lists the same sizes.

    Raises:
        ValueError: ``cubin`` is not a little-endian ELF64 image.
    """
    import struct

    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("cubin: not a little-endian ELF64 image")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    # (sh_name, sh_flags, sh_addr, sh_offset, sh_size) of each section; sh_type skipped
    headers = [struct.unpack_from("<I4xQQQQ", cubin, shoff + k * shentsize) for k in range(shnum)]
    names_at = headers[shstrndx][3]

    def name(off):
        end = cubin.index(b"\0", names_at + off)
        return cubin[names_at + off:end].decode()
    return {name(h[0])[len(".text."):]: h[4] for h in headers if name(h[0]).startswith(".text.")}
