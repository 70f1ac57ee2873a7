"""Kernel categories by name: one ordered table of (category, regex), first match wins.

Order matters: specific operations come before generic kernel families, so a fused Triton kernel
``triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0`` (Inductor lists the fused ATen ops in the
name) is a norm (``rsqrt`` is what only RMSNorm/LayerNorm do) rather than a reduction, and flash
attention built on CUTLASS (``fmha_cutlassF_*``) is attention rather than a GEMM. Checked against
names from real traces: cuBLAS (``sm90_xmma_gemm_*``, ``gemv2T_kernel``, ``nvjet_*``,
``ampere_sgemm_*``), CUTLASS (``cutlass::Kernel2<...>``, ``cutlass_80_wmma_*``), flash attention
(``flash_fwd_*``, ``fmha*``, ``pytorch_flash::...``), Inductor (``triton_poi/per/red/tem_fused_*``) and
ATen (``at::native::vectorized_elementwise_kernel<...>``, ``reduce_kernel``, ``cunn_SoftMaxForward``).
Softmax counts as sampling: our decoders run attention inside SDPA/flash kernels, so a standalone
softmax kernel in decode is the sampler's.
"""

from __future__ import annotations

import functools
import re
# Matched against the lower-cased name (faster than re.IGNORECASE on kilobyte-long C++ names).
# Inductor names fused ops as words between underscores, hence the (?:^|_)op(?:_|$) patterns.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("megakernel", r"megakernel"),
    # NCCL names every device kernel ncclKernel_* / ncclDevKernel_* (AllReduce, AllGather, SendRecv, ...).
    ("communication", r"nccl"),
    (
        "copy/memset",
        r"^memcpy|^memset|direct_copy_kernel|\bcopy_kernel|catarraybatchedcopy|fillfunctor"
        r"|fill_kernel|(?:^|_)(?:copy|clone)_?\d*$",
    ),
    ("attention", r"flash|fmha|attention|attn|sdpa|mha_(?:fwd|bwd)|(?:^|_)bmm_softmax"),
    ("norm", r"rsqrt|rms_?norm|layer_?norm|batch_?norm|group_?norm|instance_?norm"),
    ("rope", r"rotary|(?:^|[^a-z])rope(?:[^a-z]|$)|(?:^|_)cos_(?:\w*_)?sin(?:_|$)|(?:^|_)sin_(?:\w*_)?cos(?:_|$)"),
    (
        "gemm/gemv",
        r"gemm|gemv|xmma|cutlass|cublas|nvjet|wgmma|hmma|matmul|matvec|splitkreduce"
        r"|^triton_tem_|(?:^|_)(?:mm|bmm|addmm|linear)(?:_|$)|implicit_convolve|scudnn",
    ),
    (
        "reduction/sampling",
        r"reduce_?kernel|reduction|(?<![a-z])reduce(?![a-z])|argmax|argmin|topk|top_k|sort|softmax|multinomial|sampl"
        r"|cumsum|scan_?kernel|devicescan|^triton_(?:red|per)_",
    ),
    (
        "elementwise/activation",
        r"elementwise|vectorized|unrolled|silu|gelu|relu|swiglu|act_and_mul"
        r"|sigmoid|tanh|dropout|embedding|index|gather|scatter|^triton_poi_",
    ),
)
OTHER = "other"
CATEGORY_NAMES: tuple[str, ...] = tuple(c for c, _ in CATEGORIES) + (OTHER,)


@functools.cache
def _compiled() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((cat, re.compile(rx)) for cat, rx in CATEGORIES)


@functools.lru_cache(maxsize=65536)
def categorize(name: str, kind: str = "kernel") -> str:
    """Category of one GPU activity: the first matching row of :data:`CATEGORIES`, else ``other``.

    ``kind`` is the activity kind from the trace (kernel, memcpy, memset); memcpy and memset
    activities are ``copy/memset`` whatever their name.
    """
    if kind in ("memcpy", "memset"):
        return "copy/memset"
    name = name.lower()
    for cat, rx in _compiled():
        if rx.search(name):
            return cat
    return OTHER
