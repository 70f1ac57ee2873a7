"""Model configs, presets, weight loaders and tokenizers (no engine or profiling code here).

Names are resolved lazily (PEP 562): ``from bubblescope.models.config import PRESETS`` must not import
torch, so listing presets stays instant.
"""

import importlib

_WHERE = {"PRESETS": "config", "ModelConfig": "config", "get_preset": "config",
          "LoadedModel": "loader", "find_model_file": "loader", "load_model": "loader", "resolve_device": "loader",
          "LayerWeights": "weights", "ModelWeights": "weights", "dummy_weights": "weights",
          "load_hf_checkpoint": "weights", "load_llama2c": "weights", "parse_dtype": "weights",
          "run_dtype": "weights", "QuantizedLinear": "quant", "quantize_fp8": "quant", "WEIGHT_FORMATS": "quant"}

__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
