"""The ``quantization_config`` of an FP8 checkpoint in the compressed-tensors layout: checked, and which weights it
quantizes. Free of torch, so that ``diagnose trace --model`` sizes an FP8 checkpoint's step from its config alone
(the tensors are read by :mod:`.quant`).
"""

from __future__ import annotations

from ..errors import BubblescopeError

# What is read: ``config.json``'s ``quantization_config`` with ``quant_method: compressed-tensors``, format
# ``float-quantized`` (FP8 weights and dynamic FP8 activations, "FP8-dynamic") or ``naive-quantized`` (FP8 weights
# only), status ``compressed``, and in every config group a weight scheme of ``type: float``, ``num_bits: 8``,
# ``strategy: channel``, symmetric, static (``dynamic: false``). The tensors are ``<name>.weight`` in
# float8_e4m3fn and ``<name>.weight_scale`` of shape (out, 1) (compressed-tensors' ``NaiveQuantizationCompressor``:
# dequantize = weight · weight_scale; symmetric schemes store no zero point). Anything else is refused by name.
_ACCEPTED_FORMATS = ("float-quantized", "naive-quantized")
# What ``weights.save_hf_checkpoint`` writes for FP8 weights (activations unquantized: naive-quantized).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "naive-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                  "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                                              "symmetric": True, "dynamic": False, "group_size": None}}},
    "kv_cache_scheme": None, "sparsity_config": None,
}
SUPPORTED = ("bubblescope reads FP8 e4m3 compressed-tensors checkpoints with static per-channel weight scales "
             "only")


def _refuse(where: str, what: str) -> BubblescopeError:
    return BubblescopeError(f"{where}: quantization_config {what} is not supported; {SUPPORTED}")


def check_quantization_config(qc, where: str) -> list[str]:
    """Accept exactly the compressed-tensors FP8 per-channel layout (see above); returns notes for the user
    (one line each: dynamic activation quantization that is not applied here).

    Args:
        qc: ``config.json``'s ``quantization_config`` value.
        where: the config file, for the messages.

    Raises:
        BubblescopeError: any other quantization method, format, status, scheme, KV-cache or sparsity scheme,
            or static input activation scales (the message names the field and its value).
    """
    if not isinstance(qc, dict):
        raise _refuse(where, f"of type {type(qc).__name__}")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise _refuse(where, f"quant_method {method!r}")
    fmt = qc.get("format")
    if fmt not in _ACCEPTED_FORMATS:
        raise _refuse(where, f"format {fmt!r} (accepted: {', '.join(_ACCEPTED_FORMATS)})")
    if qc.get("quantization_status", "compressed") != "compressed":
        raise _refuse(where, f"quantization_status {qc.get('quantization_status')!r} (only compressed)")
    for key in ("kv_cache_scheme", "transform_config"):
        if qc.get(key) is not None:
            raise _refuse(where, f"{key} (a quantized KV cache or a weight transform)")
    sparsity = qc.get("sparsity_config")
    if sparsity is not None and not (isinstance(sparsity, dict) and sparsity.get("format", "dense") == "dense"):
        raise _refuse(where, "sparsity_config (sparse weights)")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse(where, "without config_groups")
    notes = []
    for gname, g in groups.items():
        if not isinstance(g, dict):
            raise _refuse(where, f"config group {gname} of type {type(g).__name__}")
        if g.get("format") not in (None, *_ACCEPTED_FORMATS):
            raise _refuse(where, f"config group {gname} format {g.get('format')!r}")
        w = g.get("weights")
        want = {"type": "float", "num_bits": 8, "strategy": "channel"}
        if not isinstance(w, dict):
            raise _refuse(where, f"config group {gname} without a weight scheme")
        for key, value in want.items():
            if w.get(key) != value:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r} (need {value!r})")
        for key, value in (("symmetric", True), ("dynamic", False)):
            if w.get(key, value) is not value:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r} (need {value})")
        for key in ("group_size", "block_structure", "actorder"):
            if w.get(key) is not None:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r}")
        if g.get("output_activations") is not None:
            raise _refuse(where, f"config group {gname} output_activations")
        act = g.get("input_activations")
        if act is not None:
            if not isinstance(act, dict) or act.get("dynamic") is not True:
                raise _refuse(where, f"config group {gname} input_activations with static scales")
            notes.append(f"weights: {where} quantizes activations dynamically ({act.get('type')} "
                         f"{act.get('num_bits')}-bit per {act.get('strategy')}); bubblescope runs the FP8 weights "
                         "with activations in --dtype (weight-only)")
    return list(dict.fromkeys(notes))


def quantized_weights(qc: dict) -> str:
    """The ``--weights`` format a checked compressed-tensors ``quantization_config`` (:func:`check_quantization_config`)
    stores: ``fp8-all`` when the LM head is quantized too, else ``fp8``.

    The projections are the ``Linear`` targets; the LM head is one too unless ``ignore`` names it, as llm-compressor
    writes (``"lm_head"``, or a pattern such as ``"re:.*lm_head"``; compressed-tensors' ``QuantizationConfig.ignore``).
    """
    ignore = qc.get("ignore") or []
    ignored = any(isinstance(name, str) and name.split(".")[-1].endswith("lm_head") for name in ignore)
    return "fp8" if ignored else "fp8-all"
