"""Compile the megakernel for a CUDA architecture without a GPU (Triton's compiler and bundled ``ptxas``).

Catches compiled-mode errors that the interpreter cannot see (constexpr typing, control flow, inline PTX
syntax, register pressure) on any machine with triton installed. Needs a process where triton is in
compiled mode (no ``TRITON_INTERPRET=1``). ``--weights fp8`` / ``fp8-all`` compiles the FP8 variant (float8_e4m3fn
layer matrices, and LM head, with float32 row scales). Usage:
``python -m bubblescope.megakernel_engine.triton_kernel.offline --model llama-3.2-1b --dtype bfloat16``.
"""

from __future__ import annotations

import argparse
import json

import torch

from ...models.config import ModelConfig, get_preset
from ...models.quant import parse_weight_format
from ...models.weights import parse_dtype
from ..residency import ptxas_usage
from .host import kernel_constexprs, load_kernel, register_cap
from ..schedule import MegakernelParams, resolve_tiling

_F32_PTRS = {"cos_ptr", "sin_ptr", "pm_ptr", "pl_ptr", "pacc_ptr", "logits_ptr",
             "sqkv_ptr", "so_ptr", "sgu_ptr", "sdown_ptr", "slm_ptr"}   # the FP8 row scales (dummies without)
_LAYER_W_PTRS = {"wqkv_ptr", "wo_ptr", "wgu_ptr", "wdown_ptr"}
_I32_PTRS = {"table_ptr", "counts_ptr", "state_ptr", "counters_ptr", "done_ptr", "err_ptr"}
_I64_PTRS = {"timeline_ptr", "amax_ptr"}


def compile_offline(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, params: MegakernelParams | None = None,
                    max_seq_len: int = 2048, grid: int = 528, arch: int = 90, prefetch: int = 2,
                    weight_format: str = "bf16") -> dict:
    """Compile for ``sm_{arch}`` and report registers, spill bytes, shared memory, the PTX size and ``fp8`` (the
    PTX converts e4m3 pairs, ``cvt`` from ``e4m3x2``).

    Pointers are declared 16-byte aligned, as Triton specialises them at run time for torch tensors.
    ``weight_format``: ``bf16`` (every weight in ``dtype``), ``fp8`` (the layer matrices float8_e4m3fn) or
    ``fp8-all`` (the LM head too).

    Raises:
        EngineUnavailable: triton is in interpreter mode in this process.
        BubblescopeError: an unknown ``weight_format``.
        triton.CompilationError / RuntimeError: the kernel does not compile (the point of this check).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    parse_weight_format(weight_format)
    fp8, fp8_head = weight_format != "bf16", weight_format == "fp8-all"
    params = params or MegakernelParams()
    kernel = load_kernel(False)
    tiling = resolve_tiling(cfg, params, grid)
    cx = kernel_constexprs(cfg, tiling, params, max_seq_len, has_bias=cfg.attention_bias, has_qk_norm=cfg.qk_norm,
                           prefetch=prefetch, fp8=fp8, fp8_head=fp8_head)
    act = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    sig, attrs = {}, {}
    for idx, name in enumerate(kernel.megakernel.arg_names):
        if name in cx:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            fp8_ptr = (fp8 and name in _LAYER_W_PTRS) or (fp8_head and name == "head_ptr")
            sig[name] = "*fp32" if name in _F32_PTRS else "*i32" if name in _I32_PTRS else \
                "*i64" if name in _I64_PTRS else "*fp8e4nv" if fp8_ptr else f"*{act}"
            attrs[(idx,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name in ("eps", "sm_scale") else "i32"
    src = ASTSource(fn=kernel.megakernel, signature=sig, constexprs=cx, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                        options={"num_warps": params.num_warps, "num_stages": params.num_stages,
                                 "launch_cooperative_grid": params.cooperative, "maxnreg": register_cap(params)})
    usage = ptxas_usage(ck.asm["ptx"], arch)
    return {**usage,
            "shared_bytes": int(ck.metadata.shared), "num_warps": int(ck.metadata.num_warps),
            "cooperative": bool(ck.metadata.launch_cooperative_grid),
            "ptx_lines": ck.asm["ptx"].count("\n"), "fp8": "e4m3x2" in ck.asm["ptx"], "tiling": vars(tiling)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--prefetch", type=int, default=2, choices=(0, 1, 2))
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--weights", default="bf16", help="bf16, fp8 or fp8-all")
    ap.add_argument("--block-k", type=int, default=512)
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--max-rows", type=int, default=MegakernelParams.max_rows)
    ap.add_argument("--block-s", type=int, default=None, help="positions per attention block (default: the kernel's)")
    a = ap.parse_args()
    params = MegakernelParams(timeline=a.timeline, block_k=a.block_k, num_warps=a.num_warps, max_rows=a.max_rows,
                              block_s=a.block_s)
    info = compile_offline(get_preset(a.model), parse_dtype(a.dtype), params, arch=a.arch, prefetch=a.prefetch,
                           weight_format=a.weights)
    print(json.dumps({k: v for k, v in info.items() if k != "ptxas_log"}, indent=1))
    print(info["ptxas_log"])


if __name__ == "__main__":
    main()
