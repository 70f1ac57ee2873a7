"""Compile the fused engine's kernels for a CUDA architecture without a GPU (Triton's compiler and bundled ``ptxas``).

Catches what the CPU interpreter cannot see — compiled-mode typing (int64 atomics, bitcasts), PDL's
``griddepcontrol`` instructions, register pressure and spills — on any machine with Triton installed, for a model's
real shapes: the engine's launch plan is built over weights on the ``meta`` device (shapes and dtypes, no memory),
and every distinct kernel of it is compiled with the plan's own constexprs. Needs a process where Triton is in
compiled mode (no ``TRITON_INTERPRET=1``). ``--weights fp8`` / ``fp8-all`` compiles the FP8 variants (float8_e4m3fn
weight pointers, float32 row scales). Usage:
``python -m bubblescope.fused_engine.offline --model llama-3.2-1b --pdl --weights fp8``.
"""

from __future__ import annotations

import argparse
import json

import torch

from ..errors import EngineUnavailable
from ..models.config import ModelConfig, get_preset
from ..models.quant import FP8_DTYPE, QuantizedLinear, parse_weight_format
from ..models.weights import LayerWeights, ModelWeights, parse_dtype
from .engine import FusedEngine, FusedParams

_TL = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32", torch.int64: "i64",
       FP8_DTYPE: "fp8e4nv"}


def meta_weights(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, weight_format: str = "bf16") -> ModelWeights:
    """Weights of ``cfg``'s shapes on the ``meta`` device: (out_features, in_features) per projection, as
    :class:`~bubblescope.models.weights.ModelWeights` holds them; no memory is allocated. ``weight_format`` ``fp8``
    makes the projections (``fp8-all``: and the LM head) :class:`~bubblescope.models.quant.QuantizedLinear` of
    float8_e4m3fn data and float32 row scales."""
    parse_weight_format(weight_format)

    def t(*shape):
        return torch.empty(shape, dtype=dtype, device="meta")

    def lin(out, inp, quantize=weight_format != "bf16"):
        if not quantize:
            return t(out, inp)
        return QuantizedLinear(torch.empty((out, inp), dtype=FP8_DTYPE, device="meta"),
                               torch.empty((out,), dtype=torch.float32, device="meta"))
    H, Q, KV, I, D = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.head_dim
    layers = [LayerWeights(t(H), lin(Q, H), lin(KV, H), lin(KV, H), lin(H, Q), t(H), lin(I, H), lin(I, H), lin(H, I),
                           *((t(Q), t(KV), t(KV)) if cfg.attention_bias else (None, None, None)),
                           *((t(D), t(D)) if cfg.qk_norm else (None, None)))
              for _ in range(cfg.num_hidden_layers)]
    emb = t(cfg.vocab_size, H)
    if weight_format == "fp8-all":
        head = lin(cfg.vocab_size, H)
    else:
        head = emb if cfg.tie_word_embeddings else t(cfg.vocab_size, H)
    return ModelWeights(cfg, emb, layers, t(H), head)


def _trigger_before_wait(ptx: str) -> bool:
    trigger, wait = ptx.find("griddepcontrol.launch_dependents"), ptx.find("griddepcontrol.wait")
    return 0 <= trigger < wait


def compile_offline(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, params: FusedParams | None = None,
                    pdl: bool = True, max_seq_len: int = 2048, arch: int = 90, splits: int = 32,
                    weight_format: str = "bf16") -> list[dict]:
    """Compile each distinct kernel of the fused engine's step for ``sm_{arch}``; one dict per kernel:
    ``{"kernel", "registers", "spill_store_bytes", "shared_bytes", "num_warps", "griddepcontrol", "fp8",
    "trigger_before_wait", "l2_prefetch"}`` (``fp8``: the kernel converts e4m3 weights, PTX ``cvt`` from ``e4m3x2``;
    ``trigger_before_wait``: PTX's first ``griddepcontrol.launch_dependents`` comes before its first
    ``griddepcontrol.wait``, as ``FusedParams.pdl_early`` asks; ``l2_prefetch``: the kernel issues
    ``cp.async.bulk.prefetch.L2``, as ``FusedParams.prefetch_o`` / ``prefetch_gateup_kb`` ask of the attention
    kernel). ``weight_format``: as
    :func:`meta_weights`.

    Pointers are declared 16-byte aligned, as Triton specialises them at run time for torch tensors.

    Raises:
        EngineUnavailable: Triton is in interpreter mode in this process.
        triton.CompilationError / subprocess.CalledProcessError: a kernel does not compile or assemble.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..megakernel_engine.residency import ptxas_usage

    if triton.knobs.runtime.interpret:
        raise EngineUnavailable("Triton is in interpreter mode in this process (TRITON_INTERPRET=1)")
    params = params or FusedParams()
    if not params.splits:
        params.splits = splits
    eng = FusedEngine(meta_weights(cfg, dtype, weight_format), max_seq_len=max_seq_len, graph=False, params=params)
    seen, out = set(), []
    for kernel, _grid, args, cx in eng._plan:
        cx = {**cx, "USE_PDL": pdl, "PDL_EARLY": pdl and params.pdl_early}
        warps = cx.pop("num_warps", params.num_warps)   # a kernel's own warps where its plan entry sets them
        if "PREFETCH" in cx:   # the engine turns it on for a CUDA device only; these weights are on meta
            cx["PREFETCH"] = bool(params.prefetch_o or params.prefetch_gateup_kb)
        key = (kernel.fn.__name__, tuple(sorted((k, str(v) if not isinstance(v, torch.Tensor) else str(v.dtype))
                                                for k, v in cx.items())))
        if key in seen:
            continue
        seen.add(key)
        bound = {**dict(zip(kernel.arg_names, args)), **cx}
        sig, attrs, constexprs = {}, {}, {}
        for idx, param in enumerate(kernel.params):
            name = param.name
            value = bound.get(name, param.default if param.has_default else None)
            if isinstance(value, torch.Tensor):   # a pointer (the scale pointers come as keywords)
                sig[name] = "*" + _TL[value.dtype]
                attrs[(idx,)] = [["tt.divisibility", 16]]
            elif param.is_constexpr or value is None:
                sig[name] = "constexpr"
                constexprs[name] = value
            else:
                sig[name] = "fp32" if isinstance(value, float) else "i32"
        src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
        ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
        usage = ptxas_usage(ck.asm["ptx"], arch)
        out.append({"kernel": kernel.fn.__name__, "registers": usage["registers"],
                    "spill_store_bytes": usage["spill_store_bytes"], "shared_bytes": int(ck.metadata.shared),
                    "num_warps": int(ck.metadata.num_warps),
                    "griddepcontrol": "griddepcontrol.wait" in ck.asm["ptx"], "fp8": "e4m3x2" in ck.asm["ptx"],
                    "trigger_before_wait": _trigger_before_wait(ck.asm["ptx"]),
                    "l2_prefetch": "cp.async.bulk.prefetch.L2" in ck.asm["ptx"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--weights", default="bf16", help="bf16, fp8 or fp8-all")
    a = ap.parse_args()
    print(json.dumps(compile_offline(get_preset(a.model), parse_dtype(a.dtype), pdl=a.pdl, arch=a.arch,
                                     weight_format=a.weights), indent=1))


if __name__ == "__main__":
    main()
