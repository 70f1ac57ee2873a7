"""The Hopper (sm_90) megakernel in Gluon: a warp-specialized TMA weight stream that never waits on activations.

``kernel`` holds the device code (the partitions and the kernel; with ``matvec``, ``attention`` and ``common``,
imported only on a CUDA device or by the offline compile check: they need Triton's Gluon dialect), ``host`` the
tiling, support check, tensor descriptors and launcher. The instruction
table, weight packing, PyTorch oracle and timeline decoding are the shared host side one level up.
"""
