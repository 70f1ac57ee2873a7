"""The CUDA runtime and driver calls that launch work or wait for it, by name, as traces spell them.

CUPTI names a call with version and stream suffixes (``cudaLaunchKernelExC_v11060``, ``_ptsz``); ROCm's
tracers name the HIP call, which mirrors CUDA's. :func:`cuda_api_name` brings both back to the CUDA call,
which is what :data:`LAUNCH_APIS` and :data:`SYNC_APIS` hold.
"""

from __future__ import annotations

import re

# The API calls that put a kernel (or a whole CUDA graph) on a stream; Triton launches through the
# driver's cuLaunchKernel. Names are compared without CUPTI's version/stream suffixes (_v11060, _ptsz), and HIP
# calls as their CUDA counterparts (cuda_api_name).
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaGraphLaunch",
        "cuGraphLaunch",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cuLaunchCooperativeKernel",
    }
)
SYNC_APIS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds|_spt)+$")
# ROCm's HIP API (what Kineto records through roctracer / rocprofiler on AMD GPUs, in the same cuda_runtime
# category) mirrors CUDA's: a hip* runtime call is the cuda* call of the same name (hipLaunchKernel,
# hipGraphLaunch, hipStreamSynchronize, hipMemcpyAsync, ...), and these, named otherwise, are the CUDA calls
# they stand for (HIP's module API is CUDA's driver API; hipExt* add events or flags to a plain launch).
_HIP_NAMES = {
    "hipModuleLaunchKernel": "cuLaunchKernel",
    "hipExtModuleLaunchKernel": "cuLaunchKernel",
    "hipHccModuleLaunchKernel": "cuLaunchKernel",
    "hipModuleLaunchCooperativeKernel": "cuLaunchCooperativeKernel",
    "hipExtLaunchKernel": "cudaLaunchKernel",
    "hipLaunchKernelExC": "cudaLaunchKernelExC",
    "hipExtLaunchMultiKernelMultiDevice": "cudaLaunchCooperativeKernelMultiDevice",
    "hipLaunchCooperativeKernelMultiDevice": "cudaLaunchCooperativeKernelMultiDevice",
    "hipCtxSynchronize": "cuCtxSynchronize",
}


def api_base_name(name: str) -> str:
    """``cudaLaunchKernelExC_v11060`` -> ``cudaLaunchKernelExC`` (CUPTI callback names carry versions)."""
    return _API_SUFFIX.sub("", name)


def cuda_api_name(name: str) -> str:
    """The CUDA call a runtime/driver API call is, by name: :func:`api_base_name`, with a HIP call (ROCm) named as
    its CUDA counterpart (``hipLaunchKernel`` -> ``cudaLaunchKernel``, ``hipModuleLaunchKernel`` ->
    ``cuLaunchKernel``, ``hipMemcpyAsync`` -> ``cudaMemcpyAsync``); what :data:`LAUNCH_APIS` and
    :data:`SYNC_APIS` are matched against."""
    base = api_base_name(name)
    if not base.startswith("hip"):
        return base
    return _HIP_NAMES.get(base) or "cuda" + base[3:]
