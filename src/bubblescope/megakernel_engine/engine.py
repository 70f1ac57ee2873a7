"""The megakernel Decoder: one persistent kernel launch per decode step, Gluon or Triton.

Implementations (``impl``): ``gluon`` (Hopper, sm_90: a warp-specialized TMA producer streams every weight tile
through a shared-memory ring ahead of the compute warps, ``gluon/``), ``triton`` (any CUDA GPU and the CPU
interpreter, ``triton_kernel/``), ``auto`` (Gluon where :func:`choose_impl` says it runs, else Triton; the
reason is kept in ``compile_info()``). Both read the same instruction table and packed weights.

Variants: ``fused`` (engine name ``megakernel``): the whole step in one launch, stages ordered by
counters; ``stages`` (``megakernel-stages``): the same task code, one launch per (layer, stage) and no
counters — the fusion ablation; ``noprefetch`` (``megakernel-noprefetch``): ``fused`` without loading weights
ahead of a task's dependency (Gluon: the producer waits for the task's inputs; Triton: no L2 prefetch) — the
pipelining ablation.

Prefill (``prefill``): ``batched`` (default) runs the prompt through batched GEMMs and attention in torch over the
packed weights (``prefill.py``) and writes its K/V into the kernel's cache, then decoding continues in the kernel;
``stepwise`` runs one decode launch per prompt token (the ablation).

FP8 weights (``--weights fp8`` / ``fp8-all``, :class:`~bubblescope.models.quant.QuantizedLinear`) run on both
kernels: each streams the float8_e4m3fn matrices and scales each row's float32 sum once (the fused engine's rule;
``triton_kernel/ops.py``; the Gluon kernel's ring holds 1-byte boxes, ``gluon/host.py``); ``auto`` picks the Gluon
kernel for them where it runs, as for bf16 (:data:`FP8_GLUON_REASON`). Batched prefill dequantizes
each packed matrix for its GEMM, as the reference engine's prefill does.

On a CPU device the Triton kernel runs under Triton's interpreter with one program over the topological
instruction list (see ``triton_kernel.host.load_kernel`` for the TRITON_INTERPRET side effect); slow, but
anyone can watch it decode.

Stuck tasks are reported without a host sync per step: after each launch the error record is copied
non-blocking to pinned memory and a CUDA event recorded; the next call examines the copy if the event has
completed (generation syncs on every token, so it has), and ``synchronize_and_check()`` always does.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from contextlib import contextmanager, nullcontext

import torch

from ..errors import BubblescopeError, EngineUnavailable, KernelStuck
from ..models.quant import SCALE_BYTES
from ..models.weights import ModelWeights
from . import residency as R
from .launcher import Launcher
from .packing import SCALE_FIELDS, pack_weights
from .prefill import PREFILL_CHUNK, PREFILL_MODES, BatchedPrefill
from .schedule import OPCODE_NAMES, MegakernelParams, build_schedule, num_counters, resolve_tiling, task_weight_rows
from .timeline import IntraKernelTimeline, decode_timeline
from .triton_kernel import host as L

VARIANTS = {"fused": "megakernel", "stages": "megakernel-stages", "noprefetch": "megakernel-noprefetch"}
# CPU (interpreter) defaults: few big tasks, since every interpreted task costs milliseconds.
CPU_PARAMS = MegakernelParams(max_rows=512, block_k=256, kv_splits=1, attn_kv_heads=64, block_s=256)
ERR_FIELDS = 16
ERR_TOKEN = 15              # the kernel's last program writes the step's greedy token into err[15]
AHEAD_MAX = 2               # launch_greedy steps whose token is unread (generate keeps one step ahead)
AMAX_EMPTY = -(2 ** 63)     # kernel.AMAX_EMPTY: the greedy key buffer between steps


IMPLS = ("auto", "gluon", "triton")
# ``auto`` with FP8 weights: the Gluon kernel where it runs. Both kernels' FP8 paths match reference-fused on an
# H100 (tests/test_gpu_megakernel.py; benchmarks/results/h100-2026-12-07-fp8/pytest_gpu_megakernel_fp8_gluon_be2b65e.log),
# and the Gluon one is the faster: Llama-3.2-1B 0.833 ms per token against the Triton kernel's 1.087
# (h100-2026-12-07-fp8/decode_fp8_1b_be2b65e.json).
FP8_GLUON_REASON = "Hopper GPU: warp-specialized TMA stream of the FP8 weights (1-byte boxes)"
# Triton's float8_e4m3fn (tl.float8e4nv) converts in hardware from sm_89 (Ada, Hopper) on; older GPUs have no e4m3
# conversion, and Triton refuses the type there when compiling.
FP8_MIN_CAPABILITY = (8, 9)


def is_fp8(weights: ModelWeights) -> bool:
    """The projections are FP8 (``weight_format`` ``fp8`` or ``fp8-all``)."""
    return weights.weight_format in ("fp8", "fp8-all")


def choose_impl(weights: ModelWeights, impl: str) -> tuple[str, str]:
    """The kernel implementation for ``impl`` (``auto``: Gluon where it runs, else Triton) and why, in words.

    FP8 weights run on both (the Gluon kernel with 16-bit activations: ``gluon.host.gluon_unsupported``); ``auto``
    picks the Gluon kernel for them where it runs, as for bf16 (:data:`FP8_GLUON_REASON`).

    Raises:
        EngineUnavailable: ``gluon`` requested where it cannot run (the reason named).
    """
    if impl == "triton":
        return "triton", "requested"
    from .gluon.host import gluon_unsupported
    cap = torch.cuda.get_device_capability(weights.device) if weights.device.type == "cuda" else None
    reason = gluon_unsupported(weights.config, weights.dtype, cap, weights.weight_format)
    if reason is None and is_fp8(weights):
        return "gluon", FP8_GLUON_REASON
    if reason is None:
        return "gluon", "Hopper GPU: warp-specialized TMA weight stream"
    if impl == "gluon":
        raise EngineUnavailable(reason)
    return "triton", reason


def check_supported(weights: ModelWeights) -> None:
    """Raises EngineUnavailable for what the kernel cannot run (named): a device, dtype or head_dim it has no
    code for, projections partly in FP8, FP8 on a GPU without e4m3 conversion."""
    cfg = weights.config
    if weights.device.type not in ("cpu", "cuda"):
        raise EngineUnavailable(f"megakernel runs on CUDA (or CPU under the Triton interpreter), not {weights.device}")
    if weights.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise EngineUnavailable(f"megakernel supports float32/bfloat16/float16 weights, not {weights.dtype}")
    if weights.weight_format == "mixed":  # one kernel variant for every layer matrix: all FP8 or none
        raise EngineUnavailable("megakernel: projections partly in FP8; load with --weights fp8 or bf16")
    if is_fp8(weights) and weights.device.type == "cuda":
        cap = torch.cuda.get_device_capability(weights.device)
        if cap < FP8_MIN_CAPABILITY:
            raise EngineUnavailable(f"megakernel: FP8 weights need an sm_89+ GPU (e4m3 conversion), this one is "
                                    f"sm_{cap[0]}{cap[1]}; use --weights bf16")
    d = cfg.head_dim
    if d & (d - 1) or d < 2:
        raise EngineUnavailable(f"megakernel needs a power-of-two head_dim, {cfg.name} has {d}")


@contextmanager
def _quiet_all_nan():
    """Under Triton's interpreter ``tl.max`` is ``np.nanmax``, which warns "All-NaN slice encountered" on the
    rows of NaN weights: the loader already names those tensors (``nonfinite_weights``), so no raw
    RuntimeWarning reaches the terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        yield


class MegakernelEngine:
    """Decoder protocol (``bubblescope.generation.Decoder``) over the persistent megakernel.

    Args:
        weights: model weights (device and dtype taken from them); they are copied into the kernel layout
            (``packing.py``), so the engine holds a second copy of the layer weights.
        params: tuning (:class:`MegakernelParams`); default ``MegakernelParams()`` on GPU, ``CPU_PARAMS`` on CPU.
        max_seq_len: KV-cache positions; default ``min(max_position_embeddings, 2048)``.
        variant: ``fused``, ``stages`` or ``noprefetch``.
        impl: ``auto``, ``gluon`` or ``triton`` (see the module docstring).
        name: the engine name reported (default: the variant's, e.g. ``megakernel``).
        prefill: ``batched`` (the prompt through batched GEMMs and attention in torch, :mod:`.prefill`, its K/V
            written into the kernel's cache) or ``stepwise`` (one decode launch per prompt token: the ablation).
        prefill_chunk: most prompt positions a batched prefill runs through the layers at once.
        prefill_graphs: run a batched prefill of at most ``prefill_chunk`` positions as a CUDA graph per 64-position
            bucket (:mod:`.prefill`); default: on a GPU. ``True`` on a CPU runs the same padded pass eagerly.

    Raises:
        BubblescopeError: unknown variant, implementation or prefill mode, or invalid params.
        EngineUnavailable: unsupported device/dtype/shape, ``gluon`` asked for where it cannot run (the reason
            named), Triton in the wrong mode, or a kernel that cannot keep even one program per SM resident.
    """

    def __init__(self, weights: ModelWeights, params: MegakernelParams | None = None,
                 max_seq_len: int | None = None, variant: str = "fused", impl: str = "auto", name: str | None = None,
                 prefill: str = "batched", prefill_chunk: int = PREFILL_CHUNK, prefill_graphs: bool | None = None):
        if variant not in VARIANTS:
            raise BubblescopeError(f"megakernel: unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
        if impl not in IMPLS:
            raise BubblescopeError(f"megakernel: unknown implementation {impl!r}; use one of {', '.join(IMPLS)}")
        if prefill not in PREFILL_MODES:
            raise BubblescopeError(f"--prefill: unknown mode {prefill!r}; use one of {', '.join(PREFILL_MODES)}")
        check_supported(weights)
        cfg = self.config = weights.config
        self.device, self.dtype, self.variant = weights.device, weights.dtype, variant
        self.name = name or VARIANTS[variant]
        self.impl, self.impl_reason = choose_impl(weights, impl)
        self.max_seq_len = int(max_seq_len or min(cfg.max_position_embeddings, 2048))
        self.weight_format = weights.weight_format  # bf16, fp8 or fp8-all (mixed is refused above)
        self.interpret = self.device.type == "cpu"
        params = params or (CPU_PARAMS if self.interpret else MegakernelParams())
        params.validate()
        if self.interpret:  # the interpreter runs programs one after another: one program, no inline asm
            params = params.replace(num_programs=1, prefetch="off", spin_sleep_ns=0, fast_launch=False)
        if variant == "noprefetch":
            params = params.replace(prefetch="off")
        self.limits = None if self.interpret else R.device_limits(self.device)
        if self.impl == "gluon":  # one CTA per SM, each weight task one TMA tile (gluon/host.py)
            from .gluon import host as GH
            params = GH.gluon_params(cfg, params, self.limits.sms, self.dtype, weights.weight_format)
        else:  # q/k-norm in the attention task is the Gluon kernel's; the Triton kernel norms whole-head QKV tiles
            params = params.replace(qk_norm_in_attn=False)
        self.params = params
        self._kernel = L.load_kernel(self.interpret)
        if self.impl == "gluon":
            self._gluon_kernel = GH.load_gluon_kernel()
        grid = params.num_programs or self.limits.sms * params.programs_per_sm
        self.tiling = resolve_tiling(cfg, params, grid)
        self.packed = pack_weights(weights, self.tiling, self.max_seq_len)
        self.prefill_mode = prefill
        graphs = self.device.type == "cuda" if prefill_graphs is None else bool(prefill_graphs)
        self._batched = (BatchedPrefill(cfg, self.packed, self.tiling, prefill_chunk, graphs=graphs)
                         if prefill == "batched" else None)
        self._alloc()
        probe = build_schedule(cfg, params, 1, self.tiling)
        self._info = {"registers": None, "spills": None, "shared_bytes": None, "num_warps": params.num_warps,
                      "programs_per_sm": None, "grid": 1, "interpret": self.interpret, "variant": variant,
                      "implementation": self.impl, "implementation_reason": self.impl_reason, "prefill": prefill,
                      "weights": self.weight_format}
        self._launchers = {params.timeline: self._launcher(params.timeline)}
        if not self.interpret:
            info = self._launchers[params.timeline].compile(*self._probe_args(probe))
            self._info.update(info, **R.size_grid(info, self.limits, params.programs_per_sm, params.num_programs),
                              requested_programs_per_sm=params.programs_per_sm, sms=self.limits.sms,
                              device_name=self.limits.name)
        grid = self._info["grid"]
        self.schedule = probe if grid == 1 else probe.with_programs(grid)
        self._launches = self.schedule.stage_schedules() if variant == "stages" else [self.schedule]
        self._tables = [(s.num_programs, s.table.to(self.device), s.counts.to(self.device),
                         torch.zeros((s.num_programs, s.table.shape[1], self._stamps), dtype=torch.int64,
                                     device=self.device))
                        for s in self._launches]
        self._info.update(tasks_per_step=len(self.schedule.tasks), launches_per_step=len(self._launches),
                          tasks_per_opcode=self.schedule.tasks_per_opcode(), tiling=dict(vars(self.tiling)),
                          prefetch=self._launchers[params.timeline].constexprs["PREFETCH"])
        if self.impl == "gluon":
            self._info["gluon"] = GH.gluon_choice(self.tiling, self._launchers[params.timeline].constexprs)
        self._max_inc = max(self.schedule.increments) if variant != "stages" else 0
        self._timeline_on = params.timeline
        self.reset()

    # ---- setup -------------------------------------------------------------------------------------------
    def _alloc(self) -> None:
        cfg, dev, dt, t = self.config, self.device, self.dtype, self.tiling
        z = lambda *shape, dtype=dt: torch.zeros(shape, dtype=dtype, device=dev)  # noqa: E731
        nq = cfg.num_attention_heads * t.kv_splits
        self.k_cache = z(cfg.num_hidden_layers, cfg.num_key_value_heads, self.max_seq_len, cfg.head_dim)
        self.v_cache = z(cfg.num_hidden_layers, cfg.num_key_value_heads, self.max_seq_len, cfg.head_dim)
        f32, i32 = torch.float32, torch.int32
        self._buf = dict(
            x_ptr=z(cfg.hidden_size), q_ptr=z(cfg.q_size), attn_ptr=z(cfg.q_size), act_ptr=z(t.i_pad),
            pm_ptr=z(nq, dtype=f32), pl_ptr=z(nq, dtype=f32), pacc_ptr=z(nq * cfg.head_dim, dtype=f32),
            logits_ptr=z(cfg.vocab_size, dtype=f32), amax_ptr=z(1, dtype=torch.int64),
            state_ptr=z(4, dtype=i32),                            # position, epoch, input token, greedy token
            counters_ptr=z(num_counters(cfg, t), dtype=i32), done_ptr=z(1, dtype=i32),
            err_ptr=z(ERR_FIELDS, dtype=i32))
        self._knew = z(cfg.kv_size)  # Gluon, q/k-norm: the raw new k of the current layer (gluon/attention.py)
        self._state, self._logits, self._err = self._buf["state_ptr"], self._buf["logits_ptr"], self._buf["err_ptr"]
        if dev.type == "cuda":
            # one pinned copy of the error record (with the step's greedy token) per step in flight: a step's
            # copy must not be overwritten before the host reads its token (launch_greedy keeps <= AHEAD_MAX)
            self._err_hosts = [torch.zeros(ERR_FIELDS, dtype=i32, pin_memory=True) for _ in range(AHEAD_MAX + 1)]
            self._err_events = [torch.cuda.Event() for _ in range(AHEAD_MAX + 1)]

    @property
    def _stamps(self) -> int:
        """Timeline stamps per task: start, ready, end (+ first and last weight load issue, input staged and last
        ring slot consumed in the Gluon kernel: ``gluon.kernel.STAMPS``)."""
        return 7 if self.impl == "gluon" else 3

    def _launcher(self, timeline: bool):
        if self.impl == "gluon":
            return self._gluon_launcher(timeline)
        cfg, p, params = self.config, self.packed, self.params.replace(timeline=timeline)
        dummy = torch.zeros(1, dtype=self.dtype, device=self.device)
        no_scale = torch.zeros(1, dtype=torch.float32, device=self.device)  # unread without FP8 / FP8_HEAD
        scales = {f"{n}_ptr": no_scale if getattr(p, n) is None else getattr(p, n) for n in SCALE_FIELDS}
        args = dict(
            self._buf, **scales, emb_ptr=p.embed, head_ptr=p.lm_head, fnorm_ptr=p.final_norm, wqkv_ptr=p.wqkv,
            bqkv_ptr=dummy if p.bqkv is None else p.bqkv, qknorm_ptr=dummy if p.qknorm is None else p.qknorm,
            anorm_ptr=p.anorm, wo_ptr=p.wo, mnorm_ptr=p.mnorm, wgu_ptr=p.wgu, wdown_ptr=p.wdown, cos_ptr=p.cos,
            sin_ptr=p.sin, kc_ptr=self.k_cache, vc_ptr=self.v_cache,
            spin_cap=params.spin_cap or (1000 if self.interpret else 1 << 22), eps=float(cfg.rms_norm_eps),
            sm_scale=1.0 / math.sqrt(cfg.head_dim))
        cx = L.kernel_constexprs(cfg, self.tiling, params, self.max_seq_len, has_bias=p.bqkv is not None,
                                 has_qk_norm=p.qknorm is not None,
                                 prefetch=L.prefetch_mode(params.prefetch, cfg, p.wqkv.dtype, self.limits),
                                 fp8=p.fp8, fp8_head=p.fp8_head)
        maxnreg = None if self.interpret else L.register_cap(params, self.limits.regs_per_sm)
        options = dict(num_warps=params.num_warps, num_stages=params.num_stages,
                       launch_cooperative_grid=params.cooperative and not self.interpret)
        if maxnreg:
            options["maxnreg"] = maxnreg
        return Launcher(self._kernel, args, cx, options, fast=params.fast_launch,
                        info={"max_registers": maxnreg, "num_stages": params.num_stages})

    def _gluon_launcher(self, timeline: bool):
        from .gluon import host as GH
        cfg, p, params = self.config, self.packed, self.params.replace(timeline=timeline)
        dummy = torch.zeros(1, dtype=self.dtype, device=self.device)
        cx = GH.gluon_constexprs(cfg, self.tiling, params, self.max_seq_len, self.dtype,
                                 has_bias=p.bqkv is not None,
                                 weight_format=self.weight_format)
        args = dict(
            {k: v for k, v in self._buf.items()},
            **GH.weight_descriptors(p, cx["BR"], cx["BK"], cx["SPLIT"], cx["MV_MMA"]),
            emb_ptr=p.embed, fnorm_ptr=p.final_norm, bqkv_ptr=dummy if p.bqkv is None else p.bqkv,
            anorm_ptr=p.anorm, mnorm_ptr=p.mnorm, cos_ptr=p.cos, sin_ptr=p.sin, kc_ptr=self.k_cache,
            vc_ptr=self.v_cache, qknorm_ptr=dummy if p.qknorm is None else p.qknorm, knew_ptr=self._knew,
            wqkv_ptr=p.wqkv, wo_ptr=p.wo, wgu_ptr=p.wgu, wdown_ptr=p.wdown, head_ptr=p.lm_head,
            spin_cap=params.spin_cap or (1 << 22), eps=float(cfg.rms_norm_eps),
            sm_scale=1.0 / math.sqrt(cfg.head_dim),
            # the FP8 row scales (None, the kernel's default, for unquantized weights): every argument is bound
            **{f"{n}_ptr": getattr(p, n) for n in SCALE_FIELDS})
        return GH.make_launcher(self._gluon_kernel, args, cx, params.num_warps, fast=params.fast_launch,
                                cooperative=params.cooperative)

    def _probe_args(self, probe):
        return (probe.table.to(self.device), probe.counts.to(self.device),
                torch.zeros(1, dtype=torch.int64, device=self.device))

    # ---- Decoder protocol --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the KV cache and rewind counters, position and epoch (also clears a stuck-kernel state)."""
        for t in (self.k_cache, self.v_cache, *(self._buf[k] for k in ("state_ptr", "counters_ptr", "done_ptr",
                                                                        "err_ptr"))):
            t.zero_()
        self._buf["amax_ptr"].fill_(AMAX_EMPTY)
        self.position = 0
        self._epoch = 0
        self._failed: str | None = None
        self._err_pending = False
        self._steps_run = 0        # steps launched since the last reset (picks the pinned copy slot)
        self._wanted = deque()     # launch_greedy steps whose token the caller has not read: GPU (copy, event), CPU int
        self._stamped = False      # the stamp buffers hold the last step's timeline
        self._launch_host_us = 0.0

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (T,) from position 0; returns float32 logits (V,) of its last position (on GPU a static
        buffer the next call overwrites; on CPU a copy). Decoding continues at position T.

        ``batched`` (default): the whole prompt through batched GEMMs and attention in torch
        (:class:`.prefill.BatchedPrefill`), its K/V written into the kernel's cache (L, n_kv, S, D); the logits
        come from the same torch path (final norm + LM head of position T-1) and the greedy token the next
        ``launch_greedy(None)`` reads is their argmax, as after a kernel step. ``stepwise``: T launches of the
        decode kernel, which fill the cache exactly as decoding would (the ablation).

        Raises:
            BubblescopeError: empty prompt, a prompt longer than the KV cache, or a token id outside the vocabulary.
            KernelStuck: a task waited past its spin cap.
        """
        src = token_ids.reshape(-1)
        t = src.numel()
        if t == 0:
            raise BubblescopeError("prompt: empty (need at least one token)")
        if t > self.max_seq_len:
            raise BubblescopeError(f"prompt: {t} tokens do not fit the KV cache of {self.max_seq_len} positions")
        lo, hi = int(src.min()), int(src.max())  # where the ids are: a host prompt is checked without a GPU sync
        ids = src.to(self.device)
        if lo < 0 or hi >= self.config.vocab_size:
            raise BubblescopeError(f"prompt: token id {lo if lo < 0 else hi} outside the vocabulary of "
                                   f"{self.config.vocab_size}")
        self.reset()
        if self._batched is None:
            for tok in ids.tolist():
                self._step(int(tok))
            return self._out()
        self._logits.copy_(self._batched.run(ids, self.k_cache, self.v_cache))
        # The state a kernel step leaves (position, epoch, input token, greedy token), on the device without a
        # sync: position T; epoch 0 (no launch ran, the counters are still at 0 from reset); the argmax (first
        # maximum, as the kernel's pick) as the token a launch_greedy(None) decodes next.
        best = torch.argmax(self._logits).to(torch.int32).view(1)
        self._state[0:1].fill_(t)
        self._state[2:4].copy_(best.expand(2))
        self._err[ERR_TOKEN:ERR_TOKEN + 1].copy_(best)
        self.position = t
        return self._out()

    def prefill_graphs_captured(self) -> int:
        """CUDA graphs the batched prefill has captured, one per padded-length bucket used (0 without graphs)."""
        return 0 if self._batched is None else self._batched.graphs_captured()

    def prefill_graph_error(self) -> str | None:
        """Why the batched prefill stopped capturing graphs (a capture failed; it runs eagerly since), or None."""
        return None if self._batched is None else self._batched.graph_error

    @torch.inference_mode()
    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        """One decode step for ``token`` (int or LongTensor (1,)); returns float32 logits (V,) (on GPU a static
        buffer the next call overwrites; on CPU a copy).

        A device tensor's id is not range-checked (that would need a sync); the kernel clamps it.

        Raises:
            BubblescopeError: the KV cache is full, an int token outside the vocabulary, or steps queued by
                :meth:`launch_greedy` still unread.
            KernelStuck: a task of this or (on GPU) an earlier step waited past its spin cap.
        """
        if self._wanted:  # their pinned copies could be overwritten before the tokens are read
            raise BubblescopeError("decode: steps queued by launch_greedy are unread (next_greedy_token first)")
        self._decode_step(token)
        return self._out()

    def _decode_step(self, token: int | torch.Tensor) -> None:
        if self.position >= self.max_seq_len:
            raise BubblescopeError(f"decode: the KV cache of {self.max_seq_len} positions is full")
        tok_in = -1
        if isinstance(token, torch.Tensor):
            self._state[2:3].copy_(token.reshape(-1)[:1])
        else:
            if not 0 <= int(token) < self.config.vocab_size:
                raise BubblescopeError(f"decode: token id {token} outside the vocabulary of {self.config.vocab_size}")
            tok_in = int(token)  # a kernel argument: no host-to-device write per step
        self._step(tok_in)

    @torch.inference_mode()
    def decode_greedy(self, token: int | torch.Tensor) -> int:
        """One decode step like :meth:`decode`, returning the greedy next token as a host int: the argmax of
        the step's logits (first maximum, as ``torch.argmax``), picked on the device by the LM-head tasks and
        read back together with the error record (one small copy, no argmax kernel). The logits stay
        available through :meth:`decode`'s buffer (``last_logits()``).

        Raises:
            BubblescopeError, KernelStuck: as :meth:`decode`.
        """
        if self._wanted:
            raise BubblescopeError("decode_greedy: steps queued by launch_greedy are unread (next_greedy_token)")
        if isinstance(token, torch.Tensor):  # a device token: no host read (the kernel clamps it)
            self._decode_step(token)
            self._queue_token()
            return self.next_greedy_token()
        self.launch_greedy(token)
        return self.next_greedy_token()

    # ---- steps launched ahead (the host reads a token while the next step runs) --------------------------------
    # Reading each token before launching the next step leaves the GPU idle between steps for the copy, the
    # host's wake-up, Python and the launch. With the greedy pick on the device (state[2]), the next step can be
    # launched before the host reads this one's token: generate() keeps one step ahead (vLLM's asynchronous
    # scheduling does the same). A step launched ahead that turns out not to be needed (EOS) is discarded.
    def launch_greedy(self, token: int | None) -> None:
        """Queue one greedy decode step without waiting: for ``token`` (host int), or with ``None`` for the token
        the previous step picked on the device. Read its token with :meth:`next_greedy_token`.

        Raises:
            BubblescopeError: the KV cache is full, a token outside the vocabulary, more than
                :data:`AHEAD_MAX` steps unread, or ``None`` with no step before it.
            KernelStuck: an earlier step got stuck.
        """
        if len(self._wanted) >= AHEAD_MAX:
            raise BubblescopeError(f"launch_greedy: at most {AHEAD_MAX} steps may be unread")
        if token is None:
            if self.position == 0:
                raise BubblescopeError("launch_greedy: no previous step picked a token (prefill first)")
            if self.position >= self.max_seq_len:
                raise BubblescopeError(f"decode: the KV cache of {self.max_seq_len} positions is full")
            self._step(-1)
        else:
            self._decode_step(int(token))
        self._queue_token()

    def _queue_token(self) -> None:
        """Queue the token of the step just launched: read at once on CPU (the step has run), else its copy."""
        self._wanted.append(int(self._err[ERR_TOKEN]) if self.interpret else self._inflight)

    def next_greedy_token(self) -> int:
        """Wait for the oldest step queued by :meth:`launch_greedy`; its greedy token as a host int.

        Raises:
            BubblescopeError: no step is queued. KernelStuck: that step (or an earlier one) got stuck.
        """
        if not self._wanted:
            raise BubblescopeError("next_greedy_token: no step queued (launch_greedy first)")
        entry = self._wanted.popleft()
        if isinstance(entry, int):
            return entry
        buf, event = entry
        event.synchronize()
        self._check(buf)
        return int(buf[ERR_TOKEN])

    def discard_queued(self) -> int:
        """Wait for the steps queued by :meth:`launch_greedy` and not read, and undo them: the position goes back
        by their number (their KV entries are overwritten by the next steps). Returns how many.

        Raises:
            KernelStuck: one of them (or an earlier step) got stuck.
        """
        n = 0
        while self._wanted:
            self.next_greedy_token()
            n += 1
        if n:
            self.position -= n
            self._state[0:1].fill_(self.position)  # stream-ordered: the next step reads the rewound position
        return n

    def last_logits(self) -> torch.Tensor:
        """float32 (V,) logits of the last step (the static device buffer; copy it to keep it)."""
        return self._logits

    def _out(self) -> torch.Tensor:
        # On CPU, callers' ``.float().cpu()`` would alias the static buffer (no copy): hand out a copy there.
        return self._logits.clone() if self.interpret else self._logits

    def _step(self, tok_in: int = -1) -> None:
        self._check_pending()
        if self._max_inc and (self._epoch + 2) * self._max_inc >= 2 ** 31 - 1:
            self._buf["counters_ptr"].zero_()  # rewind before int32 overflow (stream-ordered: nothing in flight)
            self._state[1:2].zero_()
            self._epoch = 0
        launch = self._launchers[self._timeline_on]
        self._launch_host_us = time.monotonic_ns() / 1e3
        last = len(self._tables) - 1
        with _quiet_all_nan() if self.interpret else nullcontext():
            for k, (grid, table, counts, stamps) in enumerate(self._tables):
                launch(grid, table, counts, stamps, advance=int(k == last), tok_in=tok_in)
        self._stamped = self._timeline_on
        self.position += 1
        self._epoch += 1
        if self.interpret:
            self._check(self._err)
        else:
            slot = self._steps_run % len(self._err_hosts)
            buf, event = self._err_hosts[slot], self._err_events[slot]
            buf.copy_(self._err, non_blocking=True)
            event.record()
            self._inflight = (buf, event)
            self._err_pending = True
        self._steps_run += 1

    # ---- stuck-task detection ------------------------------------------------------------------------------
    def _check_pending(self) -> None:
        if self._failed:
            raise KernelStuck(self._failed)
        if self._err_pending and self._inflight[1].query():
            self._err_pending = False
            self._check(self._inflight[0])

    def _check(self, err: torch.Tensor) -> None:
        e = err.tolist()
        if e[0]:
            self._failed = (
                f"megakernel task stuck: {OPCODE_NAMES.get(e[1], e[1])} layer {e[2]} tile {e[3]} (task #{e[8]}, "
                f"program {e[4]}) waited for counter {e[5]} ({self.schedule.counter_name(e[5])}) to reach {e[7]} "
                f"increments this step, saw {e[6]}; {e[9]} task(s) stuck in total. Call reset() to continue.")
            raise KernelStuck(self._failed)

    def synchronize_and_check(self) -> None:
        """Wait for the device; raise KernelStuck if any step so far got stuck."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._err_pending = False
        if self._failed:
            raise KernelStuck(self._failed)
        self._check(self._err.cpu())

    # ---- introspection --------------------------------------------------------------------------------------
    def compile_info(self) -> dict:
        """``registers``, ``spills``, ``shared_bytes``, ``num_warps``, ``programs_per_sm``, ``grid`` (always
        present; register data None under the interpreter), residency limits, tiling, task counts; for the Gluon
        kernel ``gluon``, its tile shapes (``gluon.host.gluon_choice``); ``prefill_graphs``: whether the batched
        prefill replays CUDA graphs (``prefill_graph_error``: why a failed capture turned them off)."""
        graphs = self._batched is not None and self._batched.graphs
        return dict(self._info, prefill_graphs=graphs, prefill_graph_error=self.prefill_graph_error())

    def task_weight_bytes(self) -> dict[str, int]:
        """Bytes of weights one task of each weight opcode streams in this engine's launches, keyed by opcode name:
        its rows (``schedule.task_weight_rows`` of its config and the tiling its schedule ran) times the row's bytes
        in the packed matrix's element size, plus :data:`~bubblescope.models.quant.SCALE_BYTES` a row where the
        matrix is FP8 (its float32 scale); what ``timeline.stream_feed`` spreads over a task's ring slots. For 16-
        and 32-bit weights this is ``schedule.task_weight_bytes`` with their element size."""
        p = self.packed
        out = {}
        for name, (rows, width) in task_weight_rows(self.schedule.config, self.schedule.tiling).items():
            head = name == "LMHEAD"
            mat, scaled = (p.lm_head, p.fp8_head) if head else (p.wqkv, p.fp8)
            out[name] = rows * (width * mat.element_size() + (SCALE_BYTES if scaled else 0))
        return out

    def ring_slot_bytes(self) -> int | None:
        """Bytes of one slot of the Gluon kernel's weight ring (``slot_boxes`` TMA boxes of ``BR`` rows × ``BK``
        columns: the kernel's ``TILE_BYTES``), what its producer issues at a time; None for the Triton kernel (no
        ring)."""
        if self.impl != "gluon":
            return None
        from .gluon import host as GH
        return GH.ring_slot_bytes(self._launchers[self.params.timeline].constexprs, self.packed.wqkv.element_size())

    def greedy_token(self) -> torch.Tensor:
        """The argmax of the last logits, picked on the device (int64 (1,), on the device, no sync)."""
        return self._state[3:4].long()

    def last_timeline(self):
        """The last step's per-task timeline as a DataFrame (``timeline.decode_timeline``); syncs.

        Raises:
            BubblescopeError: the last step ran without the timeline (``MegakernelParams(timeline=True)`` or
                inside ``with engine.timeline():``), or no step ran since reset.
        """
        if not self._stamped:
            raise BubblescopeError("megakernel timeline: the last step was not recorded; build the engine with "
                                   "MegakernelParams(timeline=True) or decode inside `with engine.timeline():`")
        return decode_timeline(self._launches, [stamps for *_, stamps in self._tables])

    @contextmanager
    def timeline(self):
        """Record per-task timestamps while the block runs; yields an :class:`IntraKernelTimeline` that holds
        the last step's frame (and its clock offset) once the block ends.

        The timeline is a compile-time switch: the first use compiles that kernel variant; if it cannot keep
        the current grid resident, nothing is recorded and the record's ``reason`` says why.
        """
        rec = IntraKernelTimeline()
        prev = self._timeline_on
        try:
            if True not in self._launchers:
                self._launchers[True] = self._launcher_checked()
            self._timeline_on = True
        except EngineUnavailable as e:
            rec.reason = str(e)
        try:
            yield rec
        finally:
            recorded = self._timeline_on and self._stamped
            self._timeline_on = prev
            if recorded:
                rec.frame = self.last_timeline()
                stamps = self._tables[0][3]
                rec.ts_offset_us = (float(stamps[stamps > 0].min()) / 1e3 if self.interpret
                                    else self._launch_host_us)
            elif rec.reason is None:
                rec.reason = "no decode step ran inside the timeline block"

    def _launcher_checked(self) -> Launcher:
        launcher = self._launcher(True)
        if not self.interpret:
            info = launcher.compile(*self._probe_args(self.schedule))
            fit = R.size_grid(info, self.limits, self._info["programs_per_sm"])["fit_programs_per_sm"]
            if fit < self._info["programs_per_sm"]:
                raise EngineUnavailable(f"timeline kernel fits {fit} programs per SM, the engine runs "
                                        f"{self._info['programs_per_sm']} ({info['registers']} registers)")
        return launcher
