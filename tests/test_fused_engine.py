"""The fused op-by-op engine on CPU under TRITON_INTERPRET=1: each kernel against a float64 numpy reference
written here from the formulas (RMSNorm, rotate_half RoPE, softmax attention with GQA, SwiGLU, argmax), then
the whole engine against the reference engine (transformers' numerics) on tiny configs and stories260K.

The interpreter mode is fixed when triton is first imported in a process (conftest sets it on a CPU-only
machine); on a CUDA machine these tests are skipped and ``test_gpu_fused.py`` runs instead.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bubblescope.errors import BubblescopeError, EngineUnavailable
from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import load_llama2c
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .conftest import STORIES, needs_stories
from .test_megakernel_schedule import FORCED, PROMPT, TINY

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA machine: Triton runs compiled here "
                                "(test_gpu_fused.py checks the engine on the GPU)")


def _kernels():
    from bubblescope.fused_engine import kernels
    return kernels


def _np(t):
    return t.detach().double().numpy()


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean() + eps) * w


def _rope(v, c, s):
    """rotate_half RoPE of v (..., D) with cos/sin (D/2,): [lo·c − hi·s, hi·c + lo·s]."""
    half = v.shape[-1] // 2
    lo, hi = v[..., :half], v[..., half:]
    return np.concatenate([lo * c - hi * s, hi * c + lo * s], -1)


# ---- kernels -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_rope_kernel_matches_numpy(qk_norm):
    # H = 40 is no multiple of BLOCK_K = 16; 3 q heads + 1 kv head of D = 6: 15 row pairs over programs of 4.
    K = _kernels()
    g = torch.Generator().manual_seed(1)
    H, NH, NKV, D, S, pos, eps = 40, 3, 1, 6, 8, 5, 1e-5
    x = torch.randn(H, generator=g)
    nw = torch.rand(H, generator=g) + 0.5
    w = torch.randn((NH + 2 * NKV) * D, H, generator=g) / 6
    b = torch.randn((NH + 2 * NKV) * D, generator=g)
    ang = torch.rand(S, D // 2, generator=g) * 3
    cos, sin = torch.cat([ang.cos(), ang.cos()], 1), torch.cat([ang.sin(), ang.sin()], 1)   # (S, D)
    q, kraw = torch.zeros(NH * D), torch.zeros(NKV * D)
    kc, vc = torch.zeros(NKV, S, D), torch.zeros(NKV, S, D)
    posb, tok = torch.tensor([pos], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    npairs = (NH + 2 * NKV) * D // 2
    ss = (x * x).sum().reshape(1)                          # Σx², as the kernels that write x accumulate it
    K.qkv_rope_kernel[(-(-npairs // 4),)](x, x, tok, posb, nw, w, b, cos, sin, q, kraw, kc, vc, ss, eps, H=H, NH=NH,
                                          NKV=NKV, D=D, S=S, EMBED=False, HAS_BIAS=True, QK_NORM=qk_norm,
                                          STATS_IN=qk_norm,
                                          BLOCK_R=4, BLOCK_K=16, ACT=__import__("triton").language.float32,
                                          USE_PDL=False)
    y = _np(w) @ _rms(_np(x), _np(nw), eps) + _np(b)
    yq, yk, yv = y[:NH * D].reshape(NH, D), y[NH * D:(NH + NKV) * D].reshape(NKV, D), y[(NH + NKV) * D:]
    c, s = _np(ang[pos].cos()), _np(ang[pos].sin())
    np.testing.assert_allclose(_np(vc[:, pos]).ravel(), yv, rtol=1e-5, atol=1e-5)
    if qk_norm:  # raw q and k, for the q/k-norm kernel
        np.testing.assert_allclose(_np(q).reshape(NH, D), yq, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_np(kraw).reshape(NKV, D), yk, rtol=1e-5, atol=1e-5)
        assert not kc.any()
    else:
        np.testing.assert_allclose(_np(q).reshape(NH, D), _rope(yq, c, s), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_np(kc[:, pos]), _rope(yk, c, s), rtol=1e-5, atol=1e-5)
        assert not kc[:, :pos].any() and not kc[:, pos + 1:].any()


def test_qk_norm_kernel_matches_numpy():
    K = _kernels()
    g = torch.Generator().manual_seed(2)
    NH, NKV, D, S, pos, eps = 4, 2, 12, 6, 3, 1e-6          # D/2 = 6: lanes padded to 8 and masked
    q0, kraw = torch.randn(NH * D, generator=g), torch.randn(NKV * D, generator=g)
    qn, kn = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    ang = torch.rand(S, D // 2, generator=g) * 3
    cos, sin = torch.cat([ang.cos(), ang.cos()], 1), torch.cat([ang.sin(), ang.sin()], 1)
    q, kc = q0.clone(), torch.zeros(NKV, S, D)
    K.qk_norm_kernel[(NH + NKV,)](q, kraw, kc, torch.tensor([pos], dtype=torch.int32), qn, kn, cos, sin, eps,
                                  NH=NH, D=D, S=S, HALF_P=8, ACT=__import__("triton").language.float32, USE_PDL=False)
    c, s = _np(ang[pos].cos()), _np(ang[pos].sin())
    want_q = np.stack([_rope(_rms(h, _np(qn), eps), c, s) for h in _np(q0).reshape(NH, D)])
    want_k = np.stack([_rope(_rms(h, _np(kn), eps), c, s) for h in _np(kraw).reshape(NKV, D)])
    np.testing.assert_allclose(_np(q).reshape(NH, D), want_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(kc[:, pos]), want_k, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("pos,nsplit,block_s", [(0, 3, 4), (12, 3, 4), (29, 4, 8), (5, 1, 16), (29, 1, 8),
                                                 (12, 4, 16)])
def test_split_attention_and_reduce_match_numpy_softmax_with_gqa(pos, nsplit, block_s, fused):
    # 6 query heads on 2 kv heads (G = 3, padded to 4 lanes), D = 10 (padded to 16); some splits empty at pos 0;
    # (29, 1, 8): one slice of four blocks, each next block loaded ahead; (12, 4, 16) and (29, 1, 8) fused: the
    # context within one slice, whose program stores o without partials or a ticket
    K = _kernels()
    g = torch.Generator().manual_seed(3 + pos)
    NH, NKV, D, S = 6, 2, 10, 32
    q = torch.randn(NH * D, generator=g)
    kc, vc = torch.randn(NKV, S, D, generator=g), torch.randn(NKV, S, D, generator=g)
    pm, pl = torch.zeros(NH * nsplit), torch.zeros(NH * nsplit)
    pacc, o = torch.zeros(NH * nsplit * D), torch.zeros(NH * D)
    posb, tickets = torch.tensor([pos], dtype=torch.int32), torch.zeros(NKV, dtype=torch.int32)
    act, nsplit_p = __import__("triton").language.float32, max(2, 1 << (nsplit - 1).bit_length())
    K.attn_split_kernel[(NKV, nsplit)](q, kc, vc, posb, pm, pl, pacc, o, tickets, 1 / np.sqrt(D), G=3, D=D, S=S,
                                       NSPLIT=nsplit, G_P=4, D_P=16, BLOCK_S=block_s, NSPLIT_P=nsplit_p,
                                       FUSED_REDUCE=fused, ACT=act, USE_PDL=False)
    if fused:   # the last program of each kv head combined, and rewound its ticket counter for the next layer
        assert not tickets.any()
    else:
        K.attn_reduce_kernel[(NH,)](pm, pl, pacc, o, D=D, NSPLIT=nsplit, NSPLIT_P=nsplit_p, D_P=16, ACT=act,
                                    USE_PDL=False)
    for h in range(NH):
        kk, vv = _np(kc[h // 3, :pos + 1]), _np(vc[h // 3, :pos + 1])
        sc = kk @ _np(q[h * D:(h + 1) * D]) / np.sqrt(D)
        p = np.exp(sc - sc.max())
        np.testing.assert_allclose(_np(o[h * D:(h + 1) * D]), p @ vv / p.sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("grid", [0, 3, 1])
@pytest.mark.parametrize("gate_block_k", [8, 32])
def test_matvec_residual_and_gateup_match_numpy(stats, grid, gate_block_k):
    # grid 0: one program per row block; 3 and 1: a persistent grid whose programs take several blocks, some one
    # fewer than others (4 blocks on 3 programs); gate/up's columns in 3 tiles or in one (its normed h kept)
    K = _kernels()
    tl = __import__("triton").language
    g = torch.Generator().manual_seed(4)
    N, Kd, H, eps = 13, 37, 21, 1e-5                      # rows and columns masked in every program
    w, a, x = torch.randn(N, Kd, generator=g), torch.randn(Kd, generator=g), torch.randn(N, generator=g)
    x0, ss = x.clone(), torch.full((1,), 0.25)
    K.matvec_residual_kernel[(grid or 4,)](w, a, x, ss, N=N, K=Kd, BLOCK_N=4, BLOCK_K=16, STATS_OUT=stats,
                                           ACT=tl.float32, USE_PDL=False, GRID=grid)
    want = _np(x0) + _np(w) @ _np(a)
    np.testing.assert_allclose(_np(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(ss), 0.25 + (want * want).sum() if stats else 0.25, rtol=1e-5)
    xs, nw = torch.randn(H, generator=g), torch.rand(H, generator=g) + 0.5
    wg, wu, out = torch.randn(N, H, generator=g), torch.randn(N, H, generator=g), torch.zeros(N)
    ss = (xs * xs).sum().reshape(1) if stats else torch.full((1,), float("nan"))   # unread without STATS_IN
    K.gateup_kernel[(min(grid, 2) or 4,)](xs, nw, wg, wu, out, ss, eps, I=N, H=H, BLOCK_N=4, BLOCK_K=gate_block_k,
                                          STATS_IN=stats, ACT=tl.float32, USE_PDL=False, GRID=min(grid, 2))
    h = _rms(_np(xs), _np(nw), eps)
    gate, up = _np(wg) @ h, _np(wu) @ h
    np.testing.assert_allclose(_np(out), gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie_at", [None, (3, 40), (3, 19)])
@pytest.mark.parametrize("grid", [0, 2])
@pytest.mark.parametrize("block_k", [16, 8])
def test_lmhead_and_argmax_pick_the_first_maximum(tie_at, grid, block_k):
    # negative logits everywhere (a max of 0 would hide an unwritten partial), and a tie across two blocks: rows 3
    # and 40 in blocks 0 and 5, rows 3 and 19 in blocks 0 and 2 (with grid 2: 6 blocks on 2 programs, blocks 0 and 2
    # in the same one, 0 and 5 not)
    K = _kernels()
    tl = __import__("triton").language
    g = torch.Generator().manual_seed(5)
    V, H, eps = 45, 16, 1e-5
    x, nw = torch.randn(H, generator=g), torch.ones(H)
    h = torch.tensor(_rms(_np(x), 1.0, eps), dtype=torch.float32)
    target = -1 - 4 * torch.rand(V, generator=g)           # every logit negative
    if tie_at:
        target[list(tie_at)] = -0.5                          # the maximum, twice
    w = torch.outer(target, h) / h.dot(h)                    # w @ h == target
    logits, keys = torch.zeros(V), torch.full((4,), -2 ** 63, dtype=torch.int64)
    tok, tok_out, pos = (torch.zeros(1, dtype=torch.int32) for _ in range(3))
    ss = torch.tensor([7.0, 1.0, 2.0])
    # 6 programs of 8 rows fold their maxima into 4 keys (programs 0 and 4 share key 0)
    K.lmhead_kernel[(grid or 6,)](x, nw, w, logits, keys, ss, eps, V=V, H=H, BLOCK_N=8, BLOCK_K=block_k,
                                  NSLOT=4, STATS_IN=False, ACT=tl.float32, USE_PDL=False, GRID=grid)
    K.argmax_kernel[(1,)](keys, tok, tok_out, pos, ss, V=V, NSLOT=4, NSLOT_P=4, NSS=3, NSS_P=4, USE_PDL=False)
    assert not ss.any()                                    # the Σx² slots start the next step at 0
    assert (keys == -2 ** 63).all()                        # and the keys at their minimum
    want = _np(w) @ _rms(_np(x), 1.0, eps)
    assert (want < 0).all()
    np.testing.assert_allclose(_np(logits), want, rtol=1e-5, atol=1e-5)
    assert int(tok) == int(tok_out) == int(np.argmax(want)) == (tie_at[0] if tie_at else int(np.argmax(want)))
    assert int(pos) == 1


# ---- the engine ------------------------------------------------------------------------------------------------
def _fused(w, fused_reduce=False, norm_stats="reload", grid_per_sm=0, **kw):
    from bubblescope.fused_engine import FusedEngine, FusedParams
    return FusedEngine(w, max_seq_len=32, params=FusedParams(block_n=8, block_k=16, block_s=2, splits=3,
                                                              fused_reduce=fused_reduce, norm_stats=norm_stats,
                                                              grid_per_sm=grid_per_sm), **kw)


@pytest.mark.parametrize("name,fused_reduce,norm_stats,grid_per_sm",
                         [(n, n == "qwen3-qknorm", "atomic" if n == "qwen2-bias" else "reload", 0) for n in TINY]
                         + [("gqa-tied-llama3", True, "atomic", 0), ("qwen3-qknorm", True, "reload", 2)])
def test_tiny_configs_match_the_reference_engine(name, fused_reduce, norm_stats, grid_per_sm):
    # several programs per kernel, K chunks, 3 attention splits of 2-position blocks (some empty at short contexts);
    # grid_per_sm 2 on the CPU's one "SM": O-proj, gate/up and down as 2 programs taking several row blocks each
    w = dummy_weights(TINY[name], seed=0)
    want = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    got = teacher_forced_logits(_fused(w, fused_reduce, norm_stats, grid_per_sm), PROMPT, FORCED)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_one_slice_attention_and_gateup_tiles_of_their_own_match_the_reference_engine():
    # splits=1: each kv head's whole context in one slice of 2-position blocks (the next loaded ahead), stored
    # directly; gate/up with rows per program and warps of its own
    from bubblescope.fused_engine import FusedEngine, FusedParams
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=0)
    want = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    eng = FusedEngine(w, max_seq_len=32, params=FusedParams(block_n=8, block_k=16, block_s=2, splits=1,
                                                            gateup_block_n=4, gateup_warps=2))
    got = teacher_forced_logits(eng, PROMPT, FORCED)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert eng.compile_info()["gateup_block_n"] == 4


@needs_stories
def test_stories260k_matches_the_reference_teacher_forced_and_greedy():
    from bubblescope.fused_engine import FusedEngine
    w = load_llama2c(STORIES)
    ref, fe = ReferenceEngine(w, max_seq_len=64), FusedEngine(w, max_seq_len=64)
    prompt, forced = [1, 403, 31, 260], [302, 1, 7, 400, 33, 12]
    want, got = teacher_forced_logits(ref, prompt, forced), teacher_forced_logits(fe, prompt, forced)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert generate(fe, [1], 10, eos_ids=()).tokens == generate(ref, [1], 10, eos_ids=()).tokens


def test_launch_ahead_gives_the_stepwise_tokens_and_undoes_the_step_after_eos():
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=3)
    fe = _fused(w)
    plain = generate(fe, PROMPT, 6, eos_ids=(), launch_ahead=False)
    ahead = generate(fe, PROMPT, 6, eos_ids=(), launch_ahead=True)
    assert ahead.tokens == plain.tokens
    eos = plain.tokens[3]
    stopped = generate(fe, PROMPT, 6, eos_ids=(eos,), launch_ahead=True)
    first = plain.tokens.index(eos)
    assert stopped.tokens == plain.tokens[:first + 1] and stopped.stopped_at_eos
    assert fe.position == len(PROMPT) + first           # the step launched past the EOS was undone


def test_tokens_stored_by_the_pick_kernel_in_the_host_ring_are_the_copied_ones():
    # token_store "mapped": the pick kernel writes each step's token into ring[pos % 3] (a host buffer), which the
    # launch-ahead reads in place of a copy; the same tokens, the EOS step undone as before
    from bubblescope.fused_engine import FusedEngine, FusedParams
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=3)
    want = generate(_fused(w), PROMPT, 6, eos_ids=(), launch_ahead=False).tokens
    fe = FusedEngine(w, max_seq_len=32, params=FusedParams(block_n=8, block_k=16, block_s=2, splits=3,
                                                            token_store="mapped"))
    assert generate(fe, PROMPT, 6, eos_ids=(), launch_ahead=True).tokens == want
    # the last three decode steps ran at positions P + 2 .. P + 4 and picked want[3:6]
    P = len(PROMPT)
    assert [int(fe._ring[(P + i) % 3]) for i in (2, 3, 4)] == want[3:6]
    stopped = generate(fe, PROMPT, 6, eos_ids=(want[3],), launch_ahead=True)
    assert stopped.tokens == want[:want.index(want[3]) + 1] and fe.position == P + want.index(want[3])
    with pytest.raises(BubblescopeError, match="token_store 'host': must be copy or mapped"):
        FusedParams(token_store="host")


def test_user_errors_and_pdl_on_cpu():
    from bubblescope.engines import build_engine
    w = dummy_weights(TINY["mha-untied"], seed=0)
    fe = _fused(w)
    fe.prefill(torch.tensor([1]))
    with pytest.raises(BubblescopeError, match="outside the vocabulary"):
        fe.decode(64)
    with pytest.raises(BubblescopeError, match="empty"):
        fe.prefill(torch.tensor([], dtype=torch.long))
    with pytest.raises(BubblescopeError, match="do not fit"):
        fe.prefill(torch.ones(33, dtype=torch.long))
    fe.prefill(torch.ones(32, dtype=torch.long))
    with pytest.raises(BubblescopeError, match="is full"):
        fe.decode(1)
    fe.prefill(torch.tensor([1]))
    fe.launch_greedy(2)
    with pytest.raises(BubblescopeError, match="unread"):
        fe.decode(1)
    with pytest.raises(EngineUnavailable, match="Programmatic Dependent Launch"):
        build_engine("reference-fused-pdl", w, 32)
    assert build_engine("reference-fused", w, 32).kernels_per_step() == 2 * 5 + 2   # the reduction fused


def test_the_engine_listing_says_how_many_kernels_a_layer_launches():
    """`bubblescope engines` said 6 per layer; the default plan launches 5 per layer plus the LM head and the
    greedy pick: 2 layers -> 12 launches."""
    import re

    from bubblescope.engines import ENGINES, build_engine
    w = dummy_weights(TINY["mha-untied"], seed=0)
    per_layer = int(re.search(r"(\d+) per layer", ENGINES["reference-fused"].description).group(1))
    assert build_engine("reference-fused", w, 32).kernels_per_step() == 2 * per_layer + 2


def test_kernels_compile_for_sm90_without_spills_and_with_pdl():
    """Every kernel of the step, compiled by Triton and ptxas for sm_90 at real shapes (Llama-3.2-1B, Qwen3-0.6B's
    q/k-norm, Qwen2.5-0.5B's biases and 7 query heads per kv head), in a fresh interpreter (Triton's mode is per
    process): no spills, registers × warps within one SM's 65,536, and PDL's griddepcontrol.wait in each; the next
    kernel's launch allowed after the wait by default, at the first instruction with ``pdl_early``; the L2 prefetch
    instruction in the attention kernel only, and only when asked for."""
    from .conftest import compile_in_subprocess

    script = ("import json\nfrom bubblescope.models.config import get_preset\n"
              "from bubblescope.fused_engine.offline import compile_offline\n"
              "from bubblescope.fused_engine.engine import FusedParams\n"
              "out = {m: compile_offline(get_preset(m)) for m in ('llama-3.2-1b', 'qwen3-0.6b', 'qwen2.5-0.5b')}\n"
              "out['early'] = compile_offline(get_preset('qwen3-0.6b'), params=FusedParams(pdl_early=True))\n"
              "out['prefetch'] = compile_offline(get_preset('llama-3.2-1b'), params=FusedParams(prefetch_o=True, "
              "prefetch_gateup_kb=4096))\n"
              "print(json.dumps(out))")
    out = compile_in_subprocess(script)
    names = {k["kernel"] for kernels in out.values() for k in kernels}
    assert names == {"qkv_rope_kernel", "attn_split_kernel", "matvec_residual_kernel", "gateup_kernel",
                     "lmhead_kernel", "argmax_kernel", "qk_norm_kernel"}   # qk_norm: Qwen3 only
    for model, kernels in out.items():
        for k in kernels:
            assert k["spill_store_bytes"] in (0, None) and k["registers"] * k["num_warps"] * 32 <= 65536, (model, k)
            assert k["griddepcontrol"], (model, k)
            assert k["trigger_before_wait"] == (model == "early"), (model, k)
            assert k["l2_prefetch"] == (model == "prefetch" and k["kernel"] == "attn_split_kernel"), (model, k)


def test_diagnose_writes_a_valid_document_with_the_fused_engine(tmp_path):
    """`diagnose model` over the fused engine on CPU: measured, profiled, and written as a valid results document with
    its kernels per step; the PDL variant skipped with its reason."""
    import json

    from bubblescope.diagnosis import diagnose
    from bubblescope.reports.results import validate_results
    diagnose("tiny-llama", engines=["reference-fused", "reference-fused-pdl"], prompt_len=4, gen_len=3, runs=1,
             profile_steps=2, out=tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert validate_results(doc) == []
    fused, pdl = doc["engines"]
    assert fused["status"] == "ok" and fused["compile"]["kernels_per_step"] == 4 * 5 + 2   # tiny-llama: 4 layers
    assert pdl["status"] == "skipped" and "Programmatic Dependent Launch" in pdl["reason"]
