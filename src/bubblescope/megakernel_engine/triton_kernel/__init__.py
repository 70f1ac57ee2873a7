"""The plain-Triton megakernel: register tiles, 4 programs per SM, L2 prefetch before each dependency wait.

Runs on any CUDA GPU Triton supports and under the CPU interpreter (CI checks it there). ``kernel`` / ``ops``
are the device code (imported only through ``host.load_kernel``, which settles the Triton mode), ``host`` the
compile-time constants and launcher, ``offline`` the sm_90 compile check without a GPU.
"""
