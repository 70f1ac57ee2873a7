"""Host side of the kernel: Triton mode, compiling, grid sizing from residency, launching.

Triton mode. Under ``TRITON_INTERPRET=1`` Triton runs kernels on CPU tensors, but the choice is made
when ``triton`` is first imported (its library functions are decorated then) and cannot be undone in a
process. :func:`load_kernel` therefore sets ``TRITON_INTERPRET=1`` itself when a CPU engine is built
before anything imported triton (a documented, process-wide side effect: later Triton kernels of this
process are interpreted too), and raises ``EngineUnavailable`` with the fix when triton was already
imported in the other mode. Nothing here runs at import time.

Residency. A persistent kernel whose programs spin on each other deadlocks when some programs are not
resident (the H200 probe deadlocked at 8 programs per SM). So the grid is sized from the compiled
kernel: registers (allocated per warp in units of 256), threads, shared memory (plus 1 KB the runtime
reserves per block on sm_80+) and the per-SM block limit — see :func:`programs_per_sm`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from ..errors import EngineUnavailable
from ..models.config import ModelConfig
from .schedule import NFIELDS, MegakernelParams, Tiling, next_pow2

REG_ALLOC_UNIT = 256            # registers are allocated per warp in units of 256 (sm_50 .. sm_90)
SMEM_RESERVED_PER_BLOCK = 1024  # bytes the CUDA runtime reserves per resident block (sm_80+)
# Maximum resident blocks per SM by compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"); 32 elsewhere from sm_50 to sm_90.
MAX_BLOCKS_PER_SM = {(7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24, (12, 0): 32}


def load_kernel(interpret: bool):
    """Import the kernel module in the requested Triton mode; returns ``kernel`` (the module).

    Raises:
        EngineUnavailable: triton is missing, or was already imported in the other mode.
    """
    if "triton" not in sys.modules and interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError as e:  # pragma: no cover - triton is a dependency
        raise EngineUnavailable(f"megakernel needs triton ({e})") from None
    active = isinstance(tl.sum, InterpretedFunction)  # how triton itself was imported
    if active != interpret:
        if interpret:
            raise EngineUnavailable(
                "megakernel on CPU needs TRITON_INTERPRET=1 before triton is first imported, but this process "
                "already imported triton in compiled mode (set TRITON_INTERPRET=1 in the environment)")
        raise EngineUnavailable("megakernel on GPU needs compiled Triton, but TRITON_INTERPRET=1 was set when triton "
                                "was imported (unset it)")
    if bool(triton.knobs.runtime.interpret) != active:
        raise EngineUnavailable("TRITON_INTERPRET changed after triton was imported; set it once, before any import")
    from . import kernel
    return kernel


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


def prefetch_mode(prefetch: str, cfg: ModelConfig, dtype: torch.dtype, limits: "DeviceLimits | None") -> int:
    """PREFETCH constant: 0 off, 1 ``prefetch.global.L2`` per line, 2 ``cp.async.bulk.prefetch.L2``.

    ``auto`` picks bulk when the device is sm_90+ and every weight row is a multiple of 16 bytes (the
    bulk prefetch's alignment rule), else line; no device (the interpreter) means off.

    Raises:
        EngineUnavailable: ``bulk`` requested where it cannot run.
    """
    if prefetch == "off" or limits is None:
        return 0
    aligned = all((n * dtype.itemsize) % 16 == 0 for n in (cfg.hidden_size, cfg.q_size, cfg.intermediate_size))
    bulk_ok = aligned and limits.capability >= (9, 0)
    if prefetch == "bulk" and not bulk_ok:
        raise EngineUnavailable("megakernel prefetch=bulk needs sm_90+ and 16-byte aligned weight rows")
    return 2 if prefetch == "bulk" or (prefetch == "auto" and bulk_ok) else 1


def register_cap(params: MegakernelParams, regs_per_sm: int = 65536) -> int:
    """Per-thread register cap (``maxnreg``) for ``params``: ``params.max_registers``, or the most registers
    that keep ``programs_per_sm`` programs of ``num_warps`` warps resident (multiple of 8, at most 255)."""
    if params.max_registers:
        return min(255, params.max_registers)
    return max(24, min(255, regs_per_sm // (params.programs_per_sm * params.num_warps * 32) // 8 * 8))


def kernel_constexprs(cfg: ModelConfig, t: Tiling, params: MegakernelParams, max_seq_len: int, has_bias: bool,
                      has_qk_norm: bool, prefetch: int) -> dict:
    """The compile-time arguments of ``kernel.megakernel`` (model shape, tiles, switches)."""
    return dict(
        H=cfg.hidden_size, Q=cfg.q_size, KV=cfg.kv_size, I=cfg.intermediate_size, IP=t.i_pad, V=cfg.vocab_size,
        D=cfg.head_dim, G=cfg.gqa_group, NKV=cfg.num_key_value_heads, S_MAX=max_seq_len, NSPLIT=t.kv_splits,
        MIN_CHUNK=t.attn_min_chunk,
        NF=NFIELDS, HB=t.hb, GB=t.gb,
        # columns per chunk for K = H, Q, I: never wider than the matrix (masked lanes cost time on CPU)
        BLOCK_KH=min(params.block_k, next_pow2(cfg.hidden_size)), BLOCK_KQ=min(params.block_k, next_pow2(cfg.q_size)),
        BLOCK_KI=min(params.block_k, next_pow2(cfg.intermediate_size)),
        BLOCK_P=t.block_p, BLOCK_O=t.block_o, BLOCK_GU=t.block_gu, BLOCK_DN=t.block_dn, BLOCK_LM=t.block_lm,
        BLOCK_QH=t.block_qh, BLOCK_S=params.block_s, BLOCK_SPLIT=t.block_split, HAS_BIAS=has_bias,
        HAS_QK_NORM=has_qk_norm, PREFETCH=prefetch, PF_LANES=32 * params.num_warps,
        PF_AHEAD=params.prefetch_ahead, SLEEP_NS=params.spin_sleep_ns,
        TIMELINE=bool(params.timeline), W_EVICT=params.weight_eviction)


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


class Launcher:
    """Binds the engine's buffers and constants to ``kernel.megakernel`` and launches it.

    ``args``: every non-constexpr argument except the per-launch ones (table, counts, max_tasks,
    timeline, advance, tok_in); ``constexprs``: the compile-time ones. With ``fast`` the compiled kernel is
    called directly after the first launch (Triton's own launch path re-binds and re-specialises ~40
    arguments on every call); the per-launch integers are marked ``do_not_specialize`` so one binary serves
    every table and token.
    """

    def __init__(self, kernel, args: dict, constexprs: dict, num_warps: int, num_stages: int, fast: bool,
                 cooperative: bool = False, maxnreg: int | None = None):
        self.kernel = kernel
        self.args = dict(args)
        self.constexprs = dict(constexprs)
        self.num_warps, self.num_stages, self.fast = num_warps, num_stages, fast
        self.options = dict(num_warps=num_warps, num_stages=num_stages, launch_cooperative_grid=cooperative)
        if maxnreg:
            self.options["maxnreg"] = maxnreg
        self.compiled = None
        self._names = list(kernel.megakernel.arg_names)
        self._fast_calls: dict[tuple, tuple] = {}  # (grid, table, timeline, advance) -> (runner, ordered args)
        self._tok_index = self._names.index("tok_in")

    def _all(self, table, counts, timeline, advance, tok_in=-1) -> dict:
        return dict(self.args, **self.constexprs, table_ptr=table, counts_ptr=counts, max_tasks=int(table.shape[1]),
                    timeline_ptr=timeline, advance=int(advance), tok_in=int(tok_in))

    def compile(self, table, counts, timeline) -> dict:
        """Compile (no launch) and load the binary; returns registers, spills, shared memory, warps."""
        args = self._all(table, counts, timeline, 0)
        ck = self.kernel.megakernel.warmup(grid=(1,), **self.options, **args)
        if hasattr(ck, "result"):
            ck = ck.result()
        from triton.runtime.errors import OutOfResources
        try:
            ck._init_handles()
        except OutOfResources as e:  # shared memory or threads beyond the device's per-block limits
            raise EngineUnavailable(f"megakernel does not fit the device: {e}") from None
        self.compiled = ck
        return {"registers": int(ck.n_regs), "spills": int(ck.n_spills), "shared_bytes": int(ck.metadata.shared),
                "max_registers": self.options.get("maxnreg"),
                "num_warps": int(ck.metadata.num_warps), "num_stages": self.num_stages,
                "cooperative": bool(getattr(ck.metadata, "launch_cooperative_grid", False))}

    def __call__(self, grid: int, table, counts, timeline, advance: int, tok_in: int = -1) -> None:
        """Launch on ``grid`` programs; ``tok_in`` >= 0 is the step's input token, -1 reads ``state[2]``."""
        if self.fast and self.compiled is not None:
            key = (grid, table.data_ptr(), timeline.data_ptr(), advance)
            call = self._fast_calls.get(key)
            if call is None:  # the engine's buffers never move, so the bound argument list can be reused
                args = self._all(table, counts, timeline, advance)
                call = self._fast_calls[key] = (self.compiled[(grid, 1, 1)], [args[n] for n in self._names])
            call[1][self._tok_index] = int(tok_in)
            call[0](*call[1])
        else:
            self.kernel.megakernel[(grid,)](**self.options, **self._all(table, counts, timeline, advance, tok_in))
