"""Numerical fidelity of an engine against an fp32 run of the same model, on one teacher-forced token history.

A speed win is only worth as much as its numbers: each engine's logits (run in the workload's dtype, bf16 on a
GPU) are compared with the eager reference engine run in float32 on the same weights and the same tokens, by the
mean KL divergence of the fp32 distribution from the engine's and by the negative log-likelihood the engine gives
the token history. The run-dtype reference's own figures are the bar: an engine no worse than it (within
:data:`bubblescope.reports.ladder.FIDELITY_TOLERANCE`) is "matched". This is the comparison of the public
megakernel-vs-CUDA-graphs study (KL and NLL against Hugging Face fp32).
"""

from __future__ import annotations

import torch

from .errors import EngineUnavailable


def fp32_logits(weights, prompt: list[int], forced: list[int], max_seq_len: int) -> torch.Tensor:
    """The eager reference engine's teacher-forced logits over ``weights`` in float32: (len(forced) + 1, V) float32
    on the CPU, rows as :func:`~bubblescope.generation.teacher_forced_logits`.

    ``weights`` (a :class:`~bubblescope.models.weights.ModelWeights`) already in float32 are used as they are;
    others are copied to float32 on their device for the call and freed after it.

    Raises:
        EngineUnavailable: the float32 copy does not fit in the device's memory (the message says so).
    """
    from .engines import build_engine
    from .generation import teacher_forced_logits

    w32 = weights
    try:
        if weights.dtype != torch.float32:
            w32 = weights.to(dtype=torch.float32)
        ref = build_engine("reference", w32, max_seq_len)
        return teacher_forced_logits(ref, prompt, forced)
    except torch.OutOfMemoryError:
        raise EngineUnavailable("the float32 copy of the weights does not fit in the device's memory") from None
    finally:
        del w32
        if weights.device.type == "cuda":
            torch.cuda.empty_cache()


def fidelity(logits: torch.Tensor, logits_fp32: torch.Tensor, targets: list[int]) -> dict:
    """KL divergence from the fp32 run and NLL of the token history, in nats.

    Args:
        logits: an engine's teacher-forced logits, (T, V) float (T = len(targets) + 1: after the prompt, then
            after each forced token).
        logits_fp32: the fp32 reference's on the same tokens, (T, V).
        targets: the forced tokens; row i predicts ``targets[i]`` (the last row has no target).

    Returns:
        ``{"kl_vs_fp32": mean over the T rows of KL(p_fp32 ‖ p_engine) = Σ p_fp32 (log p_fp32 − log p_engine),
        "nll": mean over the rows with a target of −log p_engine(target), "nll_fp32": the same of the fp32 run}``,
        computed in float64; a value that is not finite (NaN logits) is None.
    """
    import math

    lp = torch.log_softmax(logits.double(), dim=-1)
    lq = torch.log_softmax(logits_fp32.double(), dim=-1)
    kl = (lq.exp() * (lq - lp)).sum(-1).mean().item()
    idx = torch.tensor(list(targets), dtype=torch.long)
    rows = torch.arange(len(idx))
    nll = -lp[rows, idx].mean().item() if len(idx) else float("nan")
    nll32 = -lq[rows, idx].mean().item() if len(idx) else float("nan")

    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None

    # KL is >= 0; a float64 sum of equal distributions may land a hair below
    return {"kl_vs_fp32": None if finite(kl) is None else max(kl, 0.0), "nll": finite(nll), "nll_fp32": finite(nll32)}


def fp32_oracle(weights, prompt: list[int], forced: list[int], max_seq_len: int, logits: torch.Tensor) -> dict:
    """The fp32 bar of a run: ``{"fp32"``: the fp32 reference's teacher-forced logits (:func:`fp32_logits`; the
    run-dtype reference's ``logits`` themselves when the weights are float32 already), ``"ref_fidelity"``: those
    ``logits``' own :func:`fidelity` against it, ``"fp32_reason"``: why there is none (both others None then)``}``.
    """
    try:
        fp32 = logits if weights.dtype == torch.float32 else fp32_logits(weights, prompt, forced, max_seq_len)
    except EngineUnavailable as e:
        return {"fp32": None, "ref_fidelity": None, "fp32_reason": str(e)}
    return {"fp32": fp32, "ref_fidelity": fidelity(logits, fp32, forced), "fp32_reason": None}


def fidelity_entry(got: torch.Tensor, forced: list[int], oracle: dict) -> dict:
    """An engine's numerical fidelity for its results ``correctness`` entry: ``kl_vs_fp32``, ``nll``, ``nll_fp32``
    (:func:`fidelity` of its teacher-forced logits ``got`` on the ``forced`` tokens against the oracle's fp32
    ones, :func:`fp32_oracle`), the run-dtype reference's own ``ref_kl_vs_fp32`` and ``ref_nll``, and
    ``fidelity_matched`` (:func:`bubblescope.reports.ladder.fidelity_matched`); all None without an fp32 run."""
    from .reports.ladder import fidelity_matched

    keys = ("kl_vs_fp32", "nll", "nll_fp32", "ref_kl_vs_fp32", "ref_nll", "fidelity_matched")
    if oracle.get("fp32") is None:
        return dict.fromkeys(keys)
    fid, ref = fidelity(got, oracle["fp32"], forced), oracle["ref_fidelity"]
    return {**fid, "ref_kl_vs_fp32": ref["kl_vs_fp32"], "ref_nll": ref["nll"],
            "fidelity_matched": fidelity_matched(fid["kl_vs_fp32"], fid["nll"], ref["kl_vs_fp32"], ref["nll"])}
