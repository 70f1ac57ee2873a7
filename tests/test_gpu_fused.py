"""GPU-only: the fused op-by-op engines (CUDA graph, with and without Programmatic Dependent Launch) against the
reference engine. CPU runs the interpreter tests of the same kernels (``test_fused_engine.py``)."""

from __future__ import annotations

import pytest
import torch

from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import dummy_weights, get_preset, load_llama2c
from bubblescope.reference_engine import ReferenceEngine

from .conftest import STORIES, needs_stories

pytestmark = pytest.mark.gpu


def _engines():
    if not torch.cuda.is_available():
        return ["reference-fused", "reference-fused-pdl"]
    return ["reference-fused"] + (["reference-fused-pdl"] if torch.cuda.get_device_capability()[0] >= 9 else [])


@needs_stories
@pytest.mark.parametrize("engine", _engines())
def test_stories260k_fp32_greedy_200_tokens_identical_to_reference(engine):
    from bubblescope.engines import build_engine
    w = load_llama2c(STORIES).to("cuda")
    want = generate(ReferenceEngine(w, max_seq_len=256), [1], 200, eos_ids=()).tokens
    eng = build_engine(engine, w, 256)
    assert generate(eng, [1], 200, eos_ids=()).tokens == want
    # the launch-ahead path (a token picked on the device feeds the next replay) gives the same tokens
    assert generate(eng, [1], 200, eos_ids=(), launch_ahead=False).tokens == want


@needs_stories
@pytest.mark.parametrize("early,prefetch", [(False, False), (True, False), (False, True)],
                         ids=["trigger-after-wait", "trigger-first", "l2-prefetch"])
def test_pdl_engine_has_no_race_over_20_generations(early, prefetch):
    """A PDL ordering bug shows as wrong tokens only sometimes: 20 generations of 100 tokens, each equal to the
    reference's — with the next kernel launched after each wait, at each kernel's first instruction, and with the
    attention kernel prefetching the next matrices into L2 (which must change nothing but timing)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    from bubblescope.fused_engine import FusedEngine, FusedParams
    w = load_llama2c(STORIES).to("cuda")
    want = generate(ReferenceEngine(w, max_seq_len=256), [1, 403], 100, eos_ids=()).tokens
    eng = FusedEngine(w, max_seq_len=256, pdl=True, params=FusedParams(pdl_early=early, prefetch_o=prefetch,
                                                                        prefetch_gateup_kb=64 * prefetch))
    bad = [i for i in range(20) if generate(eng, [1, 403], 100, eos_ids=()).tokens != want]
    assert not bad, f"generations {bad} differ from the reference"


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b"])
def test_bf16_teacher_forced_agreement_at_least_99_percent(engine, model):
    """bf16 top-1 agreement with the reference over 256 random tokens >= 99 %, and a relative logit error against
    the float32 model no larger than the bf16 reference's own (+10 %)."""
    from bubblescope.engines import build_engine
    w = dummy_weights(get_preset(model), "cuda", torch.bfloat16, seed=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, w.config.vocab_size, (16,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (256,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 300), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 300), prompt, forced)
    got = teacher_forced_logits(build_engine(engine, w, 300), prompt, forced)

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.99
    assert rel(got, truth) <= 1.1 * rel(ref, truth) + 1e-4, (rel(got, truth), rel(ref, truth))


@pytest.mark.parametrize("grid_per_sm", [1, 3])
def test_persistent_grids_give_the_same_logits_as_one_program_per_block(grid_per_sm):
    """O-proj, gate/up, down and the LM head as persistent grids (each program streaming several row blocks with
    the next tiles in flight) sum every row's tiles in the same order as one program per block: the teacher-forced
    logits of Llama-3.2-1B's shape (512 row blocks of the hidden size, far more than the SMs' programs) are bitwise
    those of the default grid, under PDL."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    from bubblescope.fused_engine import FusedEngine, FusedParams
    w = dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, w.config.vocab_size, (16,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (48,), generator=g).tolist()
    base = teacher_forced_logits(FusedEngine(w, 80, pdl=True), prompt, forced)
    eng = FusedEngine(w, 80, pdl=True, params=FusedParams(grid_per_sm=grid_per_sm))
    assert eng._lm_grid[0] < -(-w.config.vocab_size // eng.lm_rows), "the LM head's grid is not persistent"
    got = teacher_forced_logits(eng, prompt, forced)
    assert torch.equal(got, base), (got - base).abs().max().item()


@needs_stories
@pytest.mark.parametrize("store", ["mapped", "copy"])
def test_tokens_stored_into_mapped_host_memory_equal_the_reference(store):
    """token_store "mapped" (the default): the pick kernel writes each greedy token into pinned host memory through
    its device mapping (no copy between the graphs); "copy": a device-to-host copy after each graph. 200 greedy
    tokens with launch-ahead equal the reference's either way."""
    from bubblescope.fused_engine import FusedEngine, FusedParams
    w = load_llama2c(STORIES).to("cuda")
    want = generate(ReferenceEngine(w, max_seq_len=256), [1], 200, eos_ids=()).tokens
    pdl = torch.cuda.get_device_capability()[0] >= 9
    eng = FusedEngine(w, max_seq_len=256, pdl=pdl, params=FusedParams(token_store=store))
    assert generate(eng, [1], 200, eos_ids=(), launch_ahead=True).tokens == want
