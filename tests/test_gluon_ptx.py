"""The Gluon kernel's PTX rewrite (``megakernel_engine/gluon/ptx.py``): TMA loads given an L2 evict_first policy."""
import pytest

from bubblescope.megakernel_engine.gluon.ptx import MARKER, rewriting, tma_l2_evict_first

# three TMA loads as Triton 3.6 emits them (predicated, unpredicated, 3-D), a TMA store and a plain load
PTX = f"""\t// {MARKER}
\t@%p20 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r4], [%rd62, {{%r3705, %r3704}}], [%r178];
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r192], [%rd2, {{%r193, %r3704}}], [%r178];
\t@!%p3 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%r5], [%rd7, {{%r1, %r2, %r3}}], [%r9];
\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {{%r1, %r2}}], [%r7];
\tld.global.b32 %r8, [%rd9];
"""


def test_tma_loads_get_an_evict_first_policy_and_nothing_else_changes():
    out = tma_l2_evict_first(PTX)
    lines = out.splitlines()
    assert lines[0] == PTX.splitlines()[0] and lines[4:] == PTX.splitlines()[4:]  # marker, store, load untouched
    expected = [  # hand-written: the operands and predicates kept, the policy appended
        ("@%p20 ", "2d", "[%r4], [%rd62, {%r3705, %r3704}], [%r178]"),
        ("", "2d", "[%r192], [%rd2, {%r193, %r3704}], [%r178]"),
        ("@!%p3 ", "3d", "[%r5], [%rd7, {%r1, %r2, %r3}], [%r9]"),
    ]
    for line, (pred, dim, ops) in zip(lines[1:4], expected):
        assert line == (f"\t{{ .reg .b64 %bs_l2pol; createpolicy.fractional.L2::evict_first.b64 %bs_l2pol, 1.0; "
                        f"{pred}cp.async.bulk.tensor.{dim}.shared::cluster.global.mbarrier::complete_tx::bytes"
                        f".L2::cache_hint {ops}, %bs_l2pol; }}")


def test_unmarked_ptx_is_returned_unchanged_and_marked_ptx_without_tma_loads_is_an_error():
    unmarked = PTX.replace(MARKER, "another kernel")
    assert tma_l2_evict_first(unmarked) is unmarked
    with pytest.raises(RuntimeError, match="no TMA load"):
        tma_l2_evict_first(f"// {MARKER}\n\tld.global.b32 %r8, [%rd9];\n")


def test_rewriting_installs_the_hook_for_the_block_only_and_chains_an_existing_one():
    triton = pytest.importorskip("triton")
    seen = []
    before = lambda backend, stages, options, language, capability: seen.append("before")  # noqa: E731
    triton.knobs.runtime.add_stages_inspection_hook = before
    try:
        with rewriting(lambda ptx: ptx + "!"):
            hook = triton.knobs.runtime.add_stages_inspection_hook
            stages = {"ptx": lambda src, metadata: src + "?"}
            hook(None, stages, None, None, 90)
            assert seen == ["before"] and stages["ptx"]("x", {}) == "x?!"
        assert triton.knobs.runtime.add_stages_inspection_hook is before
    finally:
        triton.knobs.runtime.add_stages_inspection_hook = None
