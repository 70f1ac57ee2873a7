"""Model configs, presets, weight loaders and tokenizers (no engine or profiling code here)."""

from .config import PRESETS, ModelConfig, get_preset
from .loader import LoadedModel, find_model_file, load_model, resolve_device
from .weights import LayerWeights, ModelWeights, dummy_weights, load_hf_checkpoint, load_llama2c, parse_dtype

__all__ = ["PRESETS", "ModelConfig", "get_preset", "LoadedModel", "find_model_file", "load_model",
           "resolve_device", "LayerWeights", "ModelWeights", "dummy_weights", "load_hf_checkpoint",
           "load_llama2c", "parse_dtype"]
