"""GPU-only: the compiled megakernel against the reference engine (skipped on CPU; CPU runs the interpreter tests)."""

from __future__ import annotations

import pytest
import torch

from bubblescope.generation import teacher_forced_logits
from bubblescope.models import dummy_weights, get_preset
from bubblescope.reference_engine import ReferenceEngine

pytestmark = pytest.mark.gpu


def _impls():
    """The kernel implementations this GPU runs (the Gluon one needs Hopper)."""
    if not torch.cuda.is_available():
        return ["triton"]
    return ["gluon", "triton"] if torch.cuda.get_device_capability()[0] == 9 else ["triton"]


@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("variant", ["fused", "stages", "noprefetch"])
def test_megakernel_matches_reference_bf16(variant, impl):
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 128256, (16,), generator=g).tolist()
    forced = torch.randint(3, 128256, (24,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 64), prompt, forced)
    got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=64, variant=variant, impl=impl), prompt, forced)

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    # Both bf16 engines round at the same points but accumulate in different orders; the float32 model on
    # the same weights says which is off: the megakernel must be about as close to it as the reference is.
    assert rel(got, truth) < 1.5 * rel(ref, truth) + 1e-3, (rel(got, truth), rel(ref, truth))
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


def test_megakernel_fp32_tiny_matches_reference_tightly():
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset("tiny-llama"), "cuda", torch.float32, seed=2)
    prompt, forced = [1, 5, 9, 4], list(range(10, 40))
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=64), prompt, forced)
    # TF32 is off for Triton's fp32 dot only if the kernel uses tl.dot; matvecs here are fp32 FMA reductions
    assert (got - ref).abs().max().item() < 1e-3


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon megakernel needs a Hopper GPU")
def test_gluon_llama_argmax_agreement_256_random_tokens():
    """Issue 10's check: bf16 teacher-forced argmax agreement >= 99 % with the reference over 256 random tokens,
    and a relative logit error against the fp32 model no larger than the bf16 reference's own (+10 %)."""
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=3)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 128256, (4,), generator=g).tolist()
    forced = torch.randint(3, 128256, (256,), generator=g).tolist()
    got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=300, impl="gluon"), prompt, forced)
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 300), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 300), prompt, forced)

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.99
    assert rel(got, truth) <= 1.1 * rel(ref, truth), (rel(got, truth), rel(ref, truth))
