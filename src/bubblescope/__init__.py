"""bubblescope: profile and diagnose batch-size-1 LLM decode on NVIDIA GPUs.

``bubblescope.diagnose(...)`` is the main job as a library call (see :mod:`bubblescope.diagnosis`).
Heavy dependencies (torch, triton, pandas) are imported lazily, so ``import bubblescope`` is cheap.
"""

from .version import __version__ as __version__  # the package's own version, re-exported


def __getattr__(name):
    # Lazy re-export without importing torch at package import. The package is named ``diagnosis``, not
    # ``diagnose``: importing a submodule binds its name on the package, which would shadow this function.
    if name == "diagnose":
        from .diagnosis import diagnose
        return diagnose
    raise AttributeError(f"module 'bubblescope' has no attribute {name!r}")
