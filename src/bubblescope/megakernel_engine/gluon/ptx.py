"""The one PTX rewrite the Gluon kernel needs that Triton 3.6 cannot express: an L2 cache policy on the TMA loads.

Why: the weight stream reads every byte once, yet its TMA loads allocate in L2 with normal priority, so each step
evicts everything else there (the KV cache, the activations, the RMSNorm weights) and any weight lines asked of L2
ahead of the ring. ``benchmarks/l2_probe.py`` (H200, ``benchmarks/results/h200-2026-12-02-s14/l2_probe_v3.json``)
measured 17 MB of lines read by loads surviving 34 MB of later traffic read ``evict_first`` (re-read in 2.3–2.6 µs, as
fast as just read) and half to most of them gone after the same traffic without the hint (4.9–6.4 µs; 7.4 cold). Gluon
3.6's ``tma.async_copy_global_to_shared`` takes no cache policy, so with ``MegakernelParams.weight_eviction =
"evict_first"`` the kernel marks its PTX (:data:`MARKER`, a comment) and :func:`tma_l2_evict_first` rewrites each
``cp.async.bulk.tensor`` global → shared load to carry ``.L2::cache_hint`` with a ``createpolicy.fractional
.L2::evict_first`` policy (PTX ISA 8.0, sm_90), through Triton's ``knobs.runtime.add_stages_inspection_hook``
(``launcher.rewriting``).
"""

from __future__ import annotations

import re

MARKER = "bubblescope:tma-l2-evict-first"

# `@%p7 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {x, y}], [bar];`
# as Triton 3.6 emits it for tma.async_copy_global_to_shared (the predicate is optional)
_TMA_LOAD = re.compile(
    r"^(?P<indent>[ \t]*)(?P<pred>@!?%p\d+[ \t]+)?"
    r"cp\.async\.bulk\.tensor\.(?P<dim>[1-5]d)\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
    r"[ \t]+(?P<ops>\[[^\]]*\],[ \t]*\[[^\]]*\],[ \t]*\[[^\]]*\]);", re.M)


_HINTED = "complete_tx::bytes.L2::cache_hint "


def tma_l2_evict_first(ptx: str) -> str:
    """PTX text with every TMA global → shared load given an L2 ``evict_first`` cache policy, if it carries
    :data:`MARKER`; other PTX is returned unchanged.

    Each load becomes a scoped block ``{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0;
    [@p] cp.async.bulk.tensor….L2::cache_hint [dst], [map, {…}], [bar], pol; }`` (the predicate stays on the copy).
    Rewritten PTX is returned unchanged (so ``rewrite(ptx) != ptx`` tells a binary that missed the rewrite).

    Raises:
        RuntimeError: the PTX carries the marker but no TMA load, neither in the form Triton 3.6 emits nor
            rewritten (a Triton whose PTX differs: the rewrite would silently do nothing).
    """
    if MARKER not in ptx:
        return ptx
    if _TMA_LOAD.search(ptx) is None and _HINTED in ptx:
        return ptx

    def hinted(m: re.Match) -> str:
        return (f"{m['indent']}{{ .reg .b64 %bs_l2pol; createpolicy.fractional.L2::evict_first.b64 %bs_l2pol, 1.0; "
                f"{m['pred'] or ''}cp.async.bulk.tensor.{m['dim']}.shared::cluster.global.mbarrier::complete_tx::bytes"
                f".L2::cache_hint {m['ops']}, %bs_l2pol; }}")

    out, n = _TMA_LOAD.subn(hinted, ptx)
    if n == 0:
        raise RuntimeError("weight_eviction=evict_first: the kernel's PTX has no TMA load in the form this rewrite "
                           "knows (cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes)")
    return out


def tma_l2_evict_first_missing(ptx: str | None) -> str | None:
    """Why a compiled kernel that asked for :func:`tma_l2_evict_first` does not have it (no PTX to inspect, no
    :data:`MARKER`, a TMA load left without the policy, or none with it), or None when every TMA load carries it."""
    if ptx is None:
        return "its PTX is not available to check"
    if MARKER not in ptx:
        return "its PTX lacks the kernel's mark"
    if _TMA_LOAD.search(ptx) is not None:
        return "a TMA load in its PTX has no L2 cache policy"
    if _HINTED not in ptx:
        return "its PTX has no TMA load with the policy"
    return None
