"""The reference Decoder: the op-by-op model in one of three modes.

* ``eager``: every op is its own kernel launch (hundreds per token) — the baseline a profiler should explain.
  A step attends over exactly the cache positions in use.
* ``cudagraph``: the decode step is captured in a CUDA graph and replayed; the token is written into a
  static buffer by a fill kernel and the position tensor is incremented inside the graph, so a step is two
  launches and needs no host sync. A graph attends over a fixed number of cache positions, so there is one per
  context bucket (:func:`kv_bucket`: powers of two from 256), captured by :meth:`ReferenceEngine.prepare` before
  a generation needs it: a step costs what its context needs (beyond 256 positions at most twice that), not
  what the cache could hold.
* ``compile``: ``torch.compile`` (inductor fusion) of the decode step; on a GPU the compiled step is captured
  in one CUDA graph per bucket as in ``cudagraph`` mode, so this rung differs from the one below it by fusion
  alone. Not ``mode="reduce-overhead"``: its CUDA-graph trees run Python bookkeeping on every call, host time a
  synchronised decode loop pays per token and a process's host speed varies, which would blur what fusion
  buys. One compilation per context bucket (``dynamic=False``: each specialised to its length).
  Prefill stays eager (it runs once per request and a dynamic-shape compile would only move TTFT).
"""

from __future__ import annotations

import torch

from ..errors import BubblescopeError, EngineUnavailable
from ..models.weights import ModelWeights
from .model import Transformer
from ..wording import count

MODES = ("eager", "cudagraph", "compile")
CUDAGRAPH_NEEDS_CUDA = "reference mode cudagraph needs a CUDA device"  # engines.py says it before a model loads
KV_BUCKET_MIN = 256       # the smallest context bucket (positions)
RECOMPILE_LIMIT = 64      # torch._dynamo's per-function compilation limit, raised for the process (default 8)


def kv_bucket(position: int, max_seq_len: int) -> int:
    """The cache positions a captured or compiled decode step at ``position`` attends over: the smallest power of
    two ≥ ``position + 1`` and ≥ :data:`KV_BUCKET_MIN`, capped at ``max_seq_len``. Doubling keeps the graphs
    (and compilations) to ⌈log2(max_seq_len / 256)⌉ + 1 (1 up to 256 positions; 10 for 131,072) and, beyond 256
    positions, a step's attention within twice its context."""
    need = max(position + 1, KV_BUCKET_MIN)
    return min(1 << (need - 1).bit_length(), max_seq_len)


def _allow_bucket_compilations() -> None:
    """Each bucket is a compilation of the same ``Transformer.forward``, counted across engines in the process;
    past torch._dynamo's limit (8 by default) a ``fullgraph`` compile raises instead of compiling, so a long
    context or a few compile engines in one run would fail. Raised to :data:`RECOMPILE_LIMIT` (never lowered)."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"   # renamed in torch 2.6
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))


class ReferenceEngine:
    """Decoder protocol over :class:`Transformer` (see ``bubblescope.generation.Decoder``).

    Args:
        weights: model weights (device and dtype are taken from them).
        mode: ``eager``, ``cudagraph`` or ``compile``.
        max_seq_len: KV-cache positions; defaults to ``min(max_position_embeddings, 2048)``.

    Raises:
        BubblescopeError: unknown mode.
        EngineUnavailable: ``cudagraph`` without a CUDA device.
    """

    model_class = Transformer  # reference_engine.tp swaps in its tensor-parallel model

    def __init__(self, weights: ModelWeights, mode: str = "eager", max_seq_len: int | None = None):
        if mode not in MODES:
            raise BubblescopeError(f"--mode: unknown mode {mode!r}; use one of {', '.join(MODES)}")
        self.config = weights.config
        self.device = weights.device
        if mode == "cudagraph" and self.device.type != "cuda":
            raise EngineUnavailable(CUDAGRAPH_NEEDS_CUDA)
        self.mode = mode
        self.name = "reference" if mode == "eager" else f"reference-{mode}"
        self.max_seq_len = max_seq_len or min(self.config.max_position_embeddings, 2048)
        self.model = self.model_class(weights, self.max_seq_len)
        self.position = 0
        self._tok = torch.zeros(1, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}   # kv bucket -> (graph, logits)
        self._pool = None   # one memory pool shared by the buckets' graphs
        self._compiled = None
        self._ready: set[int] = set()   # buckets captured (GPU) or compiled (compile mode on a CPU)
        if mode == "compile":
            _allow_bucket_compilations()
            self._compiled = torch.compile(self.model, fullgraph=True, dynamic=False)

    # The decode step: fixed shapes for a given kv_len, position as a device tensor advanced in place (no host sync).
    def _step(self, tok: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        logits = (self.model if self._compiled is None else self._compiled)(tok, pos, kv_len=kv_len)
        pos.add_(1)
        return logits

    def reset(self) -> None:
        """Empty the KV cache (zeroed so stale values can never leak into a masked-out softmax)."""
        self.model.reset_cache()
        self.position = 0

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (T,) in one forward from position 0; returns logits (V,) of its last position.

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
        pos = torch.arange(t, device=self.device)
        logits = self.model(token_ids.to(self.device).view(-1), pos, kv_len=t)
        self.position = t
        self._pos.fill_(t)
        return logits

    @torch.inference_mode()
    def prepare(self, first_position: int, last_position: int) -> None:
        """Capture (compile, on a CPU) every context bucket that decode steps at positions ``first_position`` …
        ``last_position`` use and that is not ready yet, so that no capture or compilation lands inside a timed or
        profiled step; eager mode has nothing to prepare. Call it between generations
        (:func:`~bubblescope.generation.generate` does, before its ``reset``): the warm-up steps write the cache at
        position 0 and whatever token is in the buffer. ``last_position`` is clamped to the cache; nothing is done
        when ``last_position < first_position`` or ``first_position`` is past the cache. A generation that stops
        early (EOS) has paid for buckets it did not reach; on a CPU a compilation per bucket can take a while."""
        if self.mode == "eager" or last_position < first_position or first_position >= self.max_seq_len:
            return   # nothing to capture, or no step can run (prefill or decode refuses it)
        top = self.max_seq_len - 1
        first, last = max(0, min(int(first_position), top)), max(0, min(int(last_position), top))
        buckets = sorted({kv_bucket(p, self.max_seq_len) for p in range(first, last + 1, KV_BUCKET_MIN // 2)}
                         | {kv_bucket(last, self.max_seq_len)})
        self._pos.zero_()
        for b in buckets:
            if b in self._ready:
                continue
            if self.device.type == "cuda":
                self._capture(b)
            else:   # compile on a CPU: one compiled step compiles the bucket
                self._step(self._tok, self._pos, b)
                self._pos.zero_()
                self._ready.add(b)
        self._pos.fill_(self.position)

    @torch.inference_mode()
    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        """One decode step for ``token`` at the current position; returns logits (V,).

        In ``cudagraph``/``compile`` mode the returned tensor is a static buffer overwritten by the next step of
        its context bucket; a bucket not prepared (:meth:`prepare`) is captured here, inside the step.

        Raises:
            BubblescopeError: the KV cache is full.
        """
        if self.position >= self.max_seq_len:
            raise BubblescopeError(f"decode: the KV cache of {count(self.max_seq_len, 'position')} is full")
        if isinstance(token, torch.Tensor):
            self._tok.copy_(token.view(1))
        else:
            self._tok.fill_(int(token))
        if self.mode == "eager":
            out = self._step(self._tok, self._pos, self.position + 1)
        elif self.device.type != "cuda":   # compile on a CPU: no graph to capture
            bucket = kv_bucket(self.position, self.max_seq_len)
            out = self._step(self._tok, self._pos, bucket)
            self._ready.add(bucket)
        else:
            out = self._replay(kv_bucket(self.position, self.max_seq_len))
        self.position += 1
        return out

    def _replay(self, kv_len: int) -> torch.Tensor:
        if kv_len not in self._ready:
            self._capture(kv_len)
        graph, out = self._graphs[kv_len]
        graph.replay()
        return out

    def _capture(self, kv_len: int) -> None:
        # Warm up on a side stream (cuBLAS workspaces, lazy init; in compile mode the compilation) before capture,
        # as the CUDA-graph docs say.
        # The warm-up steps write the cache at the current position (which the step that follows writes again)
        # and advance _pos, so _pos is restored.
        pos0 = self._pos.clone()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._pos.copy_(pos0)
                self._step(self._tok, self._pos, kv_len)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._pos.copy_(pos0)
        graph = torch.cuda.CUDAGraph()
        # one pool for every bucket's graph: each graph's logits stay referenced in _graphs, and replays run one
        # after another on one stream, so memory one graph frees at capture may serve another's intermediates
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._step(self._tok, self._pos, kv_len)
        self._pos.copy_(pos0)
        self._graphs[kv_len] = (graph, out)
        self._ready.add(kv_len)
