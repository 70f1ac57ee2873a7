"""The Gluon kernel's PTX rewrite (``megakernel_engine/gluon/ptx.py``): TMA loads given an L2 evict_first policy."""
import pytest

from bubblescope.megakernel_engine.gluon.ptx import MARKER, tma_l2_evict_first
from bubblescope.megakernel_engine.launcher import rewriting

# three TMA loads as Triton 3.6 emits them (predicated, unpredicated, 3-D), a TMA store and a plain load
PTX = f"""\t// {MARKER}
\t@%p20 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r104], [%rd62, {{%r3705, %r3704}}], [%r178];
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r192], [%rd2, {{%r193, %r3704}}], [%r178];
\t@!%p3 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%r105], [%rd7, {{%r101, %r102, %r103}}], [%r109];
\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {{%r101, %r102}}], [%r107];
\tld.global.b32 %r108, [%rd9];
"""


def test_tma_loads_get_an_evict_first_policy_and_nothing_else_changes():
    out = tma_l2_evict_first(PTX)
    lines = out.splitlines()
    assert lines[0] == PTX.splitlines()[0] and lines[4:] == PTX.splitlines()[4:]  # marker, store, load untouched
    expected = [  # hand-written: the operands and predicates kept, the policy appended
        ("@%p20 ", "2d", "[%r104], [%rd62, {%r3705, %r3704}], [%r178]"),
        ("", "2d", "[%r192], [%rd2, {%r193, %r3704}], [%r178]"),
        ("@!%p3 ", "3d", "[%r105], [%rd7, {%r101, %r102, %r103}], [%r109]"),
    ]
    for line, (pred, dim, ops) in zip(lines[1:4], expected):
        assert line == (f"\t{{ .reg .b64 %bs_l2pol; createpolicy.fractional.L2::evict_first.b64 %bs_l2pol, 1.0; "
                        f"{pred}cp.async.bulk.tensor.{dim}.shared::cluster.global.mbarrier::complete_tx::bytes"
                        f".L2::cache_hint {ops}, %bs_l2pol; }}")


def test_rewritten_ptx_is_returned_unchanged():
    """The launcher tells a binary that missed the rewrite by ``rewrite(ptx) != ptx``: a rewritten one must pass."""
    once = tma_l2_evict_first(PTX)
    assert tma_l2_evict_first(once) == once and once != PTX


def test_unmarked_ptx_is_returned_unchanged_and_marked_ptx_without_tma_loads_is_an_error():
    unmarked = PTX.replace(MARKER, "another kernel")
    assert tma_l2_evict_first(unmarked) is unmarked
    with pytest.raises(RuntimeError, match="no TMA load"):
        tma_l2_evict_first(f"// {MARKER}\n\tld.global.b32 %r108, [%rd9];\n")


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


class _FakeCompiled:
    """What Launcher.compile reads of a compiled kernel (no GPU)."""
    def __init__(self, ptx):
        self.asm = {} if ptx is None else {"ptx": ptx}
        self.n_regs, self.n_spills = 255, 0
        self.metadata = type("M", (), {"shared": 1024, "num_warps": 8, "launch_cooperative_grid": True})()

    def _init_handles(self):
        pass


def _fake_kernel(ptx, cached=False):
    """A kernel whose compile emits ``ptx`` through Triton's stages hook, as a real compile does, or, ``cached``,
    returns it as a cache hit does (no stage runs)."""
    import triton

    class JIT:
        arg_names = ["table_ptr", "tok_in"]

        @staticmethod
        def warmup(grid, **kw):
            stages = {"ptx": lambda src, metadata: ptx}
            hook = triton.knobs.runtime.add_stages_inspection_hook
            if hook is not None and not cached:
                hook(None, stages, None, None, 90)
            return _FakeCompiled(stages["ptx"](None, {}) if ptx is not None else None)
    return type("K", (), {"megakernel": JIT})()


def test_launcher_compiles_under_the_rewrite_and_refuses_a_binary_without_it():
    """The launcher compiles with the rewrite installed (the fake compile passes its PTX through the hook), and
    refuses by name a binary without it: a cache hit compiled elsewhere, a kernel that lost its mark, no PTX."""
    triton = pytest.importorskip("triton")
    import torch

    from bubblescope.errors import EngineUnavailable
    from bubblescope.megakernel_engine.gluon.ptx import tma_l2_evict_first_missing
    from bubblescope.megakernel_engine.launcher import Launcher
    t = torch.zeros((1, 4), dtype=torch.int32)
    kw = dict(fast=False, ptx_rewrite=tma_l2_evict_first, ptx_check=tma_l2_evict_first_missing)
    launcher = Launcher(_fake_kernel(PTX), {}, {}, {}, **kw)
    assert launcher.compile(t, t, t)["registers"] == 255
    assert triton.knobs.runtime.add_stages_inspection_hook is None  # removed after the compile
    for kernel, why in ((_fake_kernel(PTX, cached=True), "a TMA load in its PTX has no L2 cache policy"),
                        (_fake_kernel(PTX.replace(MARKER, "x")), "lacks the kernel's mark"),
                        (_fake_kernel(None), "not available")):
        with pytest.raises(EngineUnavailable, match=why):
            Launcher(kernel, {}, {}, {}, **kw).compile(t, t, t)
    plain = Launcher(_fake_kernel(PTX, cached=True), {}, {}, {}, fast=False)  # no rewrite asked: no check
    assert plain.compile(t, t, t)["shared_bytes"] == 1024
