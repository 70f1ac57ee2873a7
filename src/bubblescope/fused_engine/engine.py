"""The fused op-by-op Decoder: five Triton kernels per layer, replayed as one CUDA graph per token.

The strongest op-by-op rung of the ablation ladder: what fusion, CUDA graphs and Programmatic Dependent Launch
buy without a persistent kernel. ``reference-fused`` replays the step's kernels (``kernels.py``: 5 per layer,
6 with Qwen3's q/k-norm, one more without the fused attention reduction, plus the LM head and the greedy pick)
as one CUDA graph; ``reference-fused-pdl`` launches the same kernels with PDL so each kernel's weight loads start
while the previous kernel drains.

Weights, KV cache, RoPE tables and prefill are the reference engine's (:class:`~bubblescope.reference_engine.
model.Transformer`): the same tensors, no copy; prefill is its batched eager forward, which fills the same
cache the kernels then read. The greedy token is picked on the device (``argmax_kernel``) and fed to the next
step there, so :func:`bubblescope.generation.generate` keeps one step in flight as it does for the megakernel.
On CPU the kernels run one launch at a time under Triton's interpreter (correctness only, no graph, no PDL).

FP8 weights (``--weights fp8`` / ``fp8-all``) stream as FP8: each matvec kernel reads the float8_e4m3fn matrix and
its float32 row scales (``W_FP8`` in ``kernels.py``); the reference model's prefill dequantizes per matvec.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from ..errors import BubblescopeError, EngineUnavailable
from ..models.quant import FP8_DTYPE, QuantizedLinear
from ..models.weights import ModelWeights
from ..reference_engine.model import Transformer
from ..wording import count

PDL_NEEDS_HOPPER = "Programmatic Dependent Launch needs an NVIDIA GPU of compute capability 9.0 (Hopper) or newer"
AHEAD_MAX = 2  # greedy steps launched and not yet read (generate() keeps one)
ARGMAX_SLOTS = 64      # int64 (max, argmax) keys the LM-head programs fold into (kernels.lmhead_kernel)
KEY_MIN = -(2 ** 63)   # a key below every logit's
_TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def pdl_unavailable(device: torch.device) -> str | None:
    """Why PDL cannot run on ``device`` (a CPU, or a GPU before sm_90), else None."""
    if device.type != "cuda":
        return PDL_NEEDS_HOPPER
    major, _ = torch.cuda.get_device_capability(device)
    return None if major >= 9 else f"{PDL_NEEDS_HOPPER}; this GPU is sm_{major}{_}"


def _fp8(t) -> dict:
    """The kernel arguments of a weight's scales: ``ws_ptr`` and ``W_FP8`` for an FP8 matrix, else none."""
    return dict(ws_ptr=t.scale, W_FP8=True) if isinstance(t, QuantizedLinear) else {}


def _mat(t) -> torch.Tensor:
    """The matrix a kernel streams: an FP8 weight's float8_e4m3fn data, or the tensor itself."""
    return t.qweight if isinstance(t, QuantizedLinear) else t


def _stack(mats: list[torch.Tensor]) -> torch.Tensor:
    """Row-stack matrices; FP8 ones through their bytes (uint8), which every device's cat supports."""
    if mats[0].dtype == FP8_DTYPE:
        return torch.cat([m.view(torch.uint8) for m in mats]).view(FP8_DTYPE)
    return torch.cat(mats)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class FusedParams:
    """Tile sizes of the fused kernels. ``block_n``: matrix rows per program (``qkv`` counts row *pairs*);
    ``block_k``: columns per load (capped at the next power of two of the row length); ``num_warps``; ``block_s``:
    KV positions per attention block; ``splits``: attention splits per kv head (0: enough to give every SM one
    program at long contexts); ``fused_reduce``: the attention splits combined by the kv head's last program (an
    atomic ticket) instead of a separate launch; ``norm_stats``: ``reload`` (each RMSNorm reads x twice: Σx², then
    the normed chunks) or ``atomic`` (the kernels that write x add its Σx² into a float32 slot);
    ``down_block_n`` / ``down_block_k``: the down projection's tile (0: ``block_n`` / ``block_k``);
    ``prefetch_o`` / ``prefetch_gateup_kb``: the attention kernel's programs, latency-bound while the weight stream
    would idle, pull the O-projection (whole) and the first ``prefetch_gateup_kb`` KB of the gate and of the up
    matrix into L2 (a CUDA device only; off by default: no faster on an H100, the O-projection's prefetch slower,
    ``h100-2026-12-07-ladder/fused_sweep_1b_prefetch_be2b65e.json``); ``pdl_early``:
    with PDL, each kernel lets the next launch at its first instruction rather than after its wait (kernels.py's
    module docstring says why that is safe; off by default: 0.977 against 0.982 ms per step on an H100, within
    the spread, ``h100-2026-12-07-ladder/fused_sweep_1b_pdl_early_890fb44.json``); ``grid_per_sm``: the O-projection,
    gate/up, down and LM-head kernels as persistent grids of at most that many programs per SM, each streaming its row blocks
    back to back with the next tiles in flight (0: one program per row block; slower on an H100: 1.001 ms per step
    at 0, 1.050 at 2, 1.113 at 3, 1.357 at 1, ``h100-2026-12-07-ladder/fused_sweep_1b_grid_5c68e54.json``);
    ``gateup_block_n`` / ``gateup_warps``: the gate/up kernel's rows per program and warps (0: ``block_n`` /
    ``num_warps``; 2 rows by default: graph replay on an H100, Llama-3.2-1B 0.966 ms per step against 0.980 with
    4 rows, 8 rows 0.998; Llama-3.1-8B 5.310 against 5.352, ``h100-2026-12-07-ladder/fused_sweep_*_gateup*_66624c9.json``);
    ``token_store``: how a greedy token reaches the host — ``copy`` (a device-to-host copy after
    each step's graph) or ``mapped`` (the default: the pick kernel stores it into pinned host memory through its
    device mapping, nothing between the graphs but an event; as ``generate()`` runs the 1B on an H100 the step's
    span was 976.6 µs against 987.0 with the copy, the same 975 µs busy,
    ``h100-2026-12-07-ladder/fused_profile_1b_pdl_greedy_*_66624c9.json``). Defaults from
    the fused engine's tile sweep on Llama-3.2-1B (graph replay, H100 and H200:
    ``benchmarks/results/h100-2026-12-06-ladder/fused_sweep_1b.json``, ``h200-2026-12-06-ladder/fused_sweep_1b.json``):
    4 rows × 2,048 columns, 4 warps and the fused reduction were fastest; Σx² by atomics was no faster than
    reloading x."""

    def __init__(self, block_n: int = 4, block_k: int = 2048, num_warps: int = 4, block_s: int = 16,
                 splits: int = 0, fused_reduce: bool = True, norm_stats: str = "reload", down_block_n: int = 0,
                 down_block_k: int = 0, pdl_early: bool = False, prefetch_o: bool = False,
                 prefetch_gateup_kb: int = 0, grid_per_sm: int = 0, gateup_block_n: int = 2, gateup_warps: int = 0,
                 token_store: str = "mapped"):
        self.block_n, self.block_k, self.num_warps, self.block_s, self.splits = block_n, block_k, num_warps, block_s, splits
        self.fused_reduce, self.norm_stats = fused_reduce, norm_stats
        self.down_block_n, self.down_block_k = down_block_n, down_block_k
        self.pdl_early = pdl_early
        self.prefetch_o, self.prefetch_gateup_kb = prefetch_o, prefetch_gateup_kb
        self.grid_per_sm = grid_per_sm
        self.gateup_block_n, self.gateup_warps = gateup_block_n, gateup_warps
        if token_store not in ("copy", "mapped"):
            raise BubblescopeError(f"token_store {token_store!r}: must be copy or mapped")
        self.token_store = token_store


# Under the CPU interpreter programs run one by one: few large tiles, and the token taken as a plain copy.
CPU_PARAMS = FusedParams(block_n=512, block_k=512, num_warps=4, block_s=64, splits=1, gateup_block_n=0,
                         token_store="copy")


class FusedEngine:
    """Decoder protocol (``bubblescope.generation.Decoder``) over the fused Triton kernels.

    Args:
        weights: model weights (device and dtype taken from them; shared with the reference model, not copied).
        max_seq_len: KV-cache positions; default ``min(max_position_embeddings, 2048)``.
        pdl: launch with Programmatic Dependent Launch (sm_90+).
        graph: replay each step as a CUDA graph (default: on a CUDA device).
        params: :class:`FusedParams` (tile sizes).

    Raises:
        EngineUnavailable: PDL on a device without it; a dtype other than float32/bfloat16/float16; an odd
            head_dim (RoPE's halves); projections only partly in FP8 (``weight_format`` ``mixed``).
    """

    def __init__(self, weights: ModelWeights, max_seq_len: int | None = None, pdl: bool = False,
                 graph: bool | None = None, params: FusedParams | None = None):
        cfg = self.config = weights.config
        self.device, self.dtype = weights.device, weights.dtype
        if pdl and (why := pdl_unavailable(self.device)):
            raise EngineUnavailable(why)
        if self.dtype not in _TL_DTYPES:
            raise EngineUnavailable(f"reference-fused: dtype {self.dtype} not supported (float32, bfloat16, float16)")
        if cfg.head_dim % 2:
            raise EngineUnavailable(f"reference-fused: head_dim {cfg.head_dim} is odd (RoPE rotates halves)")
        if weights.weight_format == "mixed":  # one kernel variant per matrix kind: all FP8 or none
            raise EngineUnavailable("reference-fused: projections partly in FP8; load with --weights fp8 or bf16")
        self.weight_format = weights.weight_format
        self.pdl = pdl
        self.name = "reference-fused-pdl" if pdl else "reference-fused"
        self.graph_mode = self.device.type == "cuda" if graph is None else graph
        self.max_seq_len = int(max_seq_len or min(cfg.max_position_embeddings, 2048))
        # The interpreter runs programs one after another, each costing milliseconds of Python: few, large
        # programs there (numpy does the tile math).
        self.params = params or (FusedParams() if self.device.type == "cuda" else CPU_PARAMS)
        self.model = Transformer(weights, self.max_seq_len)
        from . import kernels as K  # Triton's interpreter mode is fixed at its first import (engines.prepare_triton)
        self._K = K
        self._alloc()
        self._plan = self._build_plan()
        self._graph = None
        self.position = 0
        self._wanted: deque = deque()
        self._steps_run = 0

    # ---- setup ---------------------------------------------------------------------------------------------------
    def _alloc(self) -> None:
        cfg, dev, dt = self.config, self.device, self.dtype
        nh, d = cfg.num_attention_heads, cfg.head_dim
        sms = self.sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        # enough (kv head, split) programs to cover the SMs once the context is long; short contexts leave
        # splits empty, which cost one tiny program each
        self.splits = self.params.splits or max(1, min(64, _pow2(-(-sms // cfg.num_key_value_heads))))
        z = lambda *shape, dtype=dt: torch.zeros(shape, dtype=dtype, device=dev)  # noqa: E731
        f32, i32 = torch.float32, torch.int32
        self.lm_rows = min(self.params.block_n, _pow2(cfg.vocab_size))
        self._lm_grid, self._lm_gx = self._row_grid(cfg.vocab_size, self.lm_rows)
        self.nslot = min(ARGMAX_SLOTS, self._lm_grid[0])
        self._b = dict(x=z(cfg.hidden_size), q=z(cfg.q_size), kraw=z(cfg.kv_size), o=z(cfg.q_size),
                       act=z(cfg.intermediate_size), part_m=z(nh * self.splits, dtype=f32),
                       part_l=z(nh * self.splits, dtype=f32), part_acc=z(nh * self.splits * d, dtype=f32),
                       logits=z(cfg.vocab_size, dtype=f32), keys=z(self.nslot, dtype=torch.int64).fill_(KEY_MIN),
                       tok=z(1, dtype=i32), tok_out=z(1, dtype=i32),
                       pos=z(1, dtype=i32), tickets=z(cfg.num_key_value_heads, dtype=i32),
                       ss=z(2 * cfg.num_hidden_layers, dtype=f32))   # Σx² of x after each O-proj and down
        # one host slot per step that may be unread, plus the one being written; with token_store "mapped" the pick
        # kernel writes slot pos % len itself (a CPU tensor in the interpreter; pinned, thus mapped, on a GPU)
        self._ring = torch.zeros(AHEAD_MAX + 1, dtype=i32, pin_memory=dev.type == "cuda")
        if dev.type == "cuda":
            self._tok_hosts = [torch.zeros(1, dtype=i32, pin_memory=True) for _ in range(AHEAD_MAX + 1)]
            self._tok_events = [torch.cuda.Event() for _ in range(AHEAD_MAX + 1)]

    def _row_grid(self, n_rows: int, block: int) -> tuple[tuple[int], dict]:
        """The grid and ``GRID`` constexpr of a kernel over ``n_rows`` rows in blocks of ``block``: one program per
        block, or with ``grid_per_sm`` a persistent grid of at most that many programs per SM."""
        nblk = -(-n_rows // block)
        progs = self.params.grid_per_sm * self.sms
        if not progs or progs >= nblk:
            return (nblk,), {}
        return (progs,), {"GRID": progs}

    def _build_plan(self) -> list:
        """The step as a list of (kernel, grid, args, constexprs): built once, launched every step (or captured)."""
        import triton
        import triton.language as tl

        K, cfg, m, b, p = self._K, self.config, self.model, self._b, self.params
        act = getattr(tl, _TL_DTYPES[self.dtype])
        H, NH, NKV, D, S, I, V = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                  self.max_seq_len, cfg.intermediate_size, cfg.vocab_size)
        eps, half = float(cfg.rms_norm_eps), cfg.head_dim // 2
        bk = lambda k: min(p.block_k, _pow2(k))  # noqa: E731
        rows = lambda n: min(p.block_n, _pow2(n))  # noqa: E731
        pair_rows = min(max(1, p.block_n // 2), _pow2((NH + 2 * NKV) * half))

        persistent = self._row_grid
        self._stacked = []  # the stacked q|k|v weights (a copy: the kernel streams them as one matrix)
        common = dict(USE_PDL=self.pdl, PDL_EARLY=self.pdl and p.pdl_early)
        stats = p.norm_stats == "atomic"
        ss = lambda i: b["ss"][i:]  # noqa: E731  (slot 2l: x after layer l's O-proj; 2l + 1: after its down)
        plan = []
        for li, layer in enumerate(m.layers):
            qk_norm = layer.has_qk_norm
            kc, vc = layer.kv_cache.k_cache, layer.kv_cache.v_cache
            qkv = (layer.q_proj, layer.k_proj, layer.v_proj)
            w_qkv = _stack([_mat(t) for t in qkv])                                     # (Q + 2·KV, H)
            fp8_qkv = (dict(ws_ptr=torch.cat([t.scale for t in qkv]), W_FP8=True)        # (Q + 2·KV,) float32
                       if isinstance(layer.q_proj, QuantizedLinear) else {})
            b_qkv = torch.cat([layer.q_bias, layer.k_bias, layer.v_bias]) if layer.has_bias else w_qkv
            self._stacked.append((w_qkv, b_qkv, fp8_qkv.get("ws_ptr")))
            plan.append((K.qkv_rope_kernel, (triton.cdiv((NH + 2 * NKV) * half, pair_rows),),
                         (b["x"], m.embed_tokens, b["tok"], b["pos"], layer.input_layernorm, w_qkv, b_qkv, m.cos,
                          m.sin, b["q"], b["kraw"], kc, vc, ss(max(0, 2 * li - 1)), eps),
                         dict(H=H, NH=NH, NKV=NKV, D=D, S=S, EMBED=li == 0, HAS_BIAS=layer.has_bias, QK_NORM=qk_norm,
                              STATS_IN=stats and li > 0, BLOCK_R=pair_rows, BLOCK_K=bk(H), ACT=act, **common,
                              **fp8_qkv)))
            if qk_norm:
                plan.append((K.qk_norm_kernel, (NH + NKV,),
                             (b["q"], b["kraw"], kc, b["pos"], layer.q_norm, layer.k_norm, m.cos, m.sin, eps),
                             dict(NH=NH, D=D, S=S, HALF_P=_pow2(half), ACT=act, **common)))
            wo, wg, wu = _mat(layer.o_proj), _mat(layer.gate_proj), _mat(layer.up_proj)
            o_bytes = wo.nbytes if p.prefetch_o else 0
            gu_bytes = min(wg.nbytes, 1024 * p.prefetch_gateup_kb)
            plan.append((K.attn_split_kernel, (NKV, self.splits),
                         (b["q"], kc, vc, b["pos"], b["part_m"], b["part_l"], b["part_acc"], b["o"], b["tickets"],
                          1.0 / math.sqrt(D)),
                         dict(G=NH // NKV, D=D, S=S, NSPLIT=self.splits, G_P=_pow2(NH // NKV), D_P=_pow2(D),
                              BLOCK_S=p.block_s, NSPLIT_P=_pow2(self.splits), FUSED_REDUCE=p.fused_reduce, ACT=act,
                              PREFETCH=self.device.type == "cuda" and o_bytes + gu_bytes > 0,
                              LANES=32 * p.num_warps, pf_a_ptr=wo, pf_a_bytes=o_bytes, pf_b_ptr=wg, pf_c_ptr=wu,
                              pf_bc_bytes=gu_bytes, **common)))
            if not p.fused_reduce:
                plan.append((K.attn_reduce_kernel, (NH,), (b["part_m"], b["part_l"], b["part_acc"], b["o"]),
                             dict(D=D, NSPLIT=self.splits, NSPLIT_P=_pow2(self.splits), D_P=_pow2(D), ACT=act,
                                  **common)))
            grid, gx = persistent(H, rows(H))
            plan.append((K.matvec_residual_kernel, grid,
                         (_mat(layer.o_proj), b["o"], b["x"], ss(2 * li)),
                         dict(N=H, K=cfg.q_size, BLOCK_N=rows(H), BLOCK_K=bk(cfg.q_size), STATS_OUT=stats, ACT=act,
                              **common, **_fp8(layer.o_proj), **gx)))
            gn = min(p.gateup_block_n or p.block_n, _pow2(I))
            grid, gx = persistent(I, gn)
            plan.append((K.gateup_kernel, grid,
                         (b["x"], layer.post_attention_layernorm, _mat(layer.gate_proj), _mat(layer.up_proj), b["act"],
                          ss(2 * li), eps),
                         dict(I=I, H=H, BLOCK_N=gn, BLOCK_K=bk(H), STATS_IN=stats, ACT=act, **common, **gx,
                              num_warps=p.gateup_warps or p.num_warps,
                              **({"wgs_ptr": layer.gate_proj.scale, "wus_ptr": layer.up_proj.scale, "W_FP8": True}
                                 if isinstance(layer.gate_proj, QuantizedLinear) else {}))))
            dn = min(p.down_block_n or p.block_n, _pow2(H))
            grid, gx = persistent(H, dn)
            plan.append((K.matvec_residual_kernel, grid,
                         (_mat(layer.down_proj), b["act"], b["x"], ss(2 * li + 1)),
                         dict(N=H, K=I, BLOCK_N=dn, BLOCK_K=min(p.down_block_k or p.block_k, _pow2(I)), STATS_OUT=stats,
                              ACT=act, **common, **_fp8(layer.down_proj), **gx)))
        nss = 2 * cfg.num_hidden_layers
        plan.append((K.lmhead_kernel, self._lm_grid,
                     (b["x"], m.norm, _mat(m.lm_head), b["logits"], b["keys"], ss(nss - 1), eps),
                     dict(V=V, H=H, BLOCK_N=self.lm_rows, BLOCK_K=bk(H), NSLOT=self.nslot, STATS_IN=stats, ACT=act,
                          **common, **_fp8(m.lm_head), **self._lm_gx)))
        ring = dict(ring_ptr=self._ring, RING=len(self._ring)) if p.token_store == "mapped" else {}
        plan.append((K.argmax_kernel, (1,), (b["keys"], b["tok"], b["tok_out"], b["pos"], b["ss"]),
                     dict(V=V, NSLOT=self.nslot, NSLOT_P=_pow2(self.nslot), NSS=nss, NSS_P=_pow2(nss), **common,
                          **ring)))
        return plan

    def kernels_per_step(self) -> int:
        """Kernel launches in one decode step: per layer 5 with the fused attention reduction (6 without, one more
        with q/k-norm), then the LM head and the greedy pick."""
        return len(self._plan)

    def _launch_all(self) -> None:
        # The step's first kernel waits for everything before it (no PDL edge to the previous step): the kernels read
        # pos, which the previous step's last kernel wrote, before their gdc_wait.
        for k, (kernel, grid, args, cx) in enumerate(self._plan):
            extra = dict(launch_pdl=True) if self.pdl and k > 0 else {}
            kernel[grid](*args, **{"num_warps": self.params.num_warps, **cx}, **extra)   # cx may set its own warps

    # ---- Decoder protocol --------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the KV cache (zeroed) and rewind the position; queued greedy steps are dropped."""
        self.model.reset_cache()
        self._b["pos"].zero_()
        self._b["ss"].zero_()
        self._b["keys"].fill_(KEY_MIN)
        self.position = 0
        self._wanted.clear()

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (T,) through the reference model's batched forward from position 0, filling the shared
        KV cache; returns the logits (V,) of its last position (in the weights' dtype).

        Raises:
            BubblescopeError: the prompt is empty or longer than the KV cache.
        """
        t = token_ids.numel()
        if t == 0:
            raise BubblescopeError("prompt: empty (need at least one token)")
        if t > self.max_seq_len:
            raise BubblescopeError(f"prompt: {t} tokens do not fit the KV cache of "
                                   f"{count(self.max_seq_len, 'position')}")
        self.reset()
        logits = self.model(token_ids.to(self.device).view(-1), torch.arange(t, device=self.device), kv_len=t)
        self.position = t
        self._b["pos"].fill_(t)
        return logits

    def _check_room(self) -> None:
        if self.position >= self.max_seq_len:
            raise BubblescopeError(f"decode: the KV cache of {count(self.max_seq_len, 'position')} is full")

    def _set_token(self, token: int | torch.Tensor) -> None:
        if isinstance(token, torch.Tensor):
            self._b["tok"].copy_(token.reshape(-1)[:1])
        else:
            if not 0 <= int(token) < self.config.vocab_size:
                raise BubblescopeError(f"decode: token id {token} outside the vocabulary of {self.config.vocab_size}")
            self._b["tok"].fill_(int(token))

    def _run_step(self) -> None:
        if not self.graph_mode:
            self._launch_all()
        else:
            if self._graph is None:
                self._capture()
            self._graph.replay()
        self.position += 1

    def _capture(self) -> None:
        # Compile every kernel on a side stream first (a capture must not compile), as the CUDA-graph docs say;
        # that step writes the cache at the current position and advances pos and tok, so restore them.
        saved = {k: self._b[k].clone() for k in ("pos", "tok")}
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._launch_all()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for k, v in saved.items():
            self._b[k].copy_(v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._launch_all()
        for k, v in saved.items():
            self._b[k].copy_(v)
        self._graph = graph

    @torch.inference_mode()
    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        """One decode step for ``token`` (int or LongTensor (1,)); returns float32 logits (V,), rounded to the
        weights' dtype as the reference's (on GPU a static buffer the next call overwrites; on CPU a copy).

        Raises:
            BubblescopeError: the KV cache is full, a token outside the vocabulary, or greedy steps still unread.
        """
        if self._wanted:
            raise BubblescopeError("decode: steps queued by launch_greedy are unread (next_greedy_token first)")
        self._check_room()
        self._set_token(token)
        self._run_step()
        return self._b["logits"] if self.graph_mode else self._b["logits"].clone()

    @torch.inference_mode()
    def decode_greedy(self, token: int | torch.Tensor) -> int:
        """One decode step returning the greedy next token (first argmax of the logits, picked on the device)."""
        self.launch_greedy(token if not isinstance(token, torch.Tensor) else int(token.reshape(-1)[0]))
        return self.next_greedy_token()

    @torch.inference_mode()
    def launch_greedy(self, token: int | None) -> None:
        """Queue one greedy step without waiting: for ``token``, or with ``None`` for the token the previous step
        picked on the device. Read it with :meth:`next_greedy_token`.

        Raises:
            BubblescopeError: the KV cache is full, a token outside the vocabulary, more than ``AHEAD_MAX`` steps
                unread, or ``None`` with no step before it.
        """
        if len(self._wanted) >= AHEAD_MAX:
            raise BubblescopeError(f"launch_greedy: at most {AHEAD_MAX} steps may be unread")
        self._check_room()
        if token is None:
            if self.position == 0:
                raise BubblescopeError("launch_greedy: no previous step picked a token (prefill first)")
        else:
            self._set_token(token)
        slot = self.position % len(self._ring)   # the ring slot the pick kernel writes (token_store "mapped")
        self._run_step()
        mapped = self.params.token_store == "mapped"
        if self.device.type != "cuda":
            self._wanted.append(int(self._ring[slot] if mapped else self._b["tok_out"][0]))
            return
        k = self._steps_run % len(self._tok_hosts)
        event = self._tok_events[k]
        if mapped:
            buf = self._ring[slot:slot + 1]
        else:
            buf = self._tok_hosts[k]
            buf.copy_(self._b["tok_out"], non_blocking=True)
        event.record()
        self._wanted.append((buf, event))
        self._steps_run += 1

    def next_greedy_token(self) -> int:
        """Wait for the oldest queued greedy step; its token as a host int.

        Raises:
            BubblescopeError: no step is queued.
        """
        if not self._wanted:
            raise BubblescopeError("next_greedy_token: no step queued (launch_greedy first)")
        entry = self._wanted.popleft()
        if isinstance(entry, int):
            return entry
        buf, event = entry
        event.synchronize()
        return int(buf[0])

    def discard_queued(self) -> int:
        """Wait for the queued steps not read and undo them (the position goes back by their number; their KV
        entries are overwritten by the next steps). Returns how many."""
        n = 0
        while self._wanted:
            self.next_greedy_token()
            n += 1
        if n:
            self.position -= n
            self._b["pos"].fill_(self.position)  # stream-ordered: the next step reads the rewound position
        return n

    def compile_info(self) -> dict:
        """What the report shows of this engine's build: kernels per step, launch mode and tile sizes."""
        p = self.params
        # the results schema's compile keys (per-kernel registers and spills: fused_engine.offline)
        return {"registers": None, "spills": None, "shared_bytes": None, "programs_per_sm": None, "grid": None,
                "kernels_per_step": self.kernels_per_step(), "cuda_graph": self.graph_mode, "pdl": self.pdl,
                "attention_splits": self.splits, "block_n": p.block_n, "block_k": p.block_k,
                "num_warps": p.num_warps, "block_s": p.block_s,
                "fused_reduce": p.fused_reduce, "norm_stats": p.norm_stats, "pdl_early": self.pdl and p.pdl_early,
                "prefetch_o": p.prefetch_o and self.device.type == "cuda",
                "prefetch_gateup_kb": p.prefetch_gateup_kb if self.device.type == "cuda" else 0,
                "grid_per_sm": p.grid_per_sm, "gateup_block_n": p.gateup_block_n, "gateup_warps": p.gateup_warps,
                "token_store": p.token_store,
                "weights": self.weight_format}
