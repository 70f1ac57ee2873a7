"""The ``hf`` engine: transformers' own model over our weights, the peer users compare against."""

from __future__ import annotations

import torch

from .errors import BubblescopeError, EngineUnavailable
from .models.weights import ModelWeights
from .wording import count, first_few


class HFEngine:
    """transformers' ``AutoModelForCausalLM`` with our weights, as the peer users compare against.

    Decoder protocol over ``model(input_ids, past_key_values=DynamicCache())``. The model is built on the
    meta device and the weights assigned (no random init of a billion parameters), then the rotary
    embedding, whose buffers are computed in ``__init__``, is rebuilt on the real device.
    """

    def __init__(self, weights: ModelWeights, max_seq_len: int):
        from transformers import AutoConfig, AutoModelForCausalLM

        if weights.weight_format != "bf16":  # transformers would need its own FP8 kernels (a compressed-tensors model)
            raise EngineUnavailable(f"engine hf: runs unquantized weights only, these are {weights.weight_format} "
                                    "(use --weights bf16)")
        cfg = weights.config
        self.name, self.config, self.device = "hf", cfg, weights.device
        self.max_seq_len = max_seq_len
        d = cfg.to_hf_dict()
        d.pop("architectures")
        hf_cfg = AutoConfig.for_model(**d)
        hf_cfg.dtype = weights.dtype
        hf_cfg._attn_implementation = "sdpa"
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_cfg)
        _, unexpected = model.load_state_dict(weights.hf_state_dict(), strict=False, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        # A layout transformers builds differently (e.g. a programmatic Llama config with attention_bias, whose
        # o_proj bias stays on the meta device) must not fail in the first forward or drop a weight silently.
        arch = type(model).__name__
        if missing := [n for n, p in model.named_parameters() if p.is_meta]:
            raise EngineUnavailable(f"engine hf: transformers' {arch} has parameters these weights lack: "
                                    f"{first_few(missing)}")
        if unexpected:
            raise EngineUnavailable(f"engine hf: transformers' {arch} has no parameters for these weights: "
                                    f"{first_few(unexpected)}")
        rotary = model.model.rotary_emb
        # Built outside the meta context; its signature differs across transformers versions (device= or not).
        model.model.rotary_emb = type(rotary)(config=hf_cfg).to(self.device)
        self.model = model.eval()
        self.position = 0
        self._cache = None

    def reset(self) -> None:
        from transformers import DynamicCache
        self._cache = DynamicCache()
        self.position = 0

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        if token_ids.numel() > self.max_seq_len:
            raise BubblescopeError(f"prompt: {token_ids.numel()} tokens do not fit the KV cache of "
                                   f"{count(self.max_seq_len, 'position')}")
        self.reset()
        out = self._forward(token_ids.view(1, -1).to(self.device))
        self.position = token_ids.numel()
        return out.logits[0, -1]

    def _forward(self, ids: torch.Tensor):
        import warnings
        with warnings.catch_warnings():
            # transformers 5.2x renames past_key_values to cache (FutureWarning); 4.x knows only the old name.
            warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
            return self.model(ids, past_key_values=self._cache, use_cache=True)

    @torch.inference_mode()
    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        if isinstance(token, torch.Tensor):
            ids = token.view(1, 1).to(self.device)
        else:
            ids = torch.tensor([[int(token)]], device=self.device)
        out = self._forward(ids)
        self.position += 1
        return out.logits[0, -1]
