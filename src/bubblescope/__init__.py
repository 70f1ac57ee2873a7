"""bubblescope: profile and diagnose batch-size-1 LLM decode on NVIDIA GPUs.

Heavy dependencies (torch, triton, pandas) are imported lazily, so ``import bubblescope`` is cheap.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy re-export: ``bubblescope.diagnose(...)`` without importing torch at package import.
    if name == "diagnose":
        from .diagnose import diagnose
        return diagnose
    raise AttributeError(name)
