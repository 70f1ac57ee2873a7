"""Binding and launching a compiled megakernel, for either implementation (``triton_kernel``, ``gluon``)."""

from __future__ import annotations

import contextlib

from ..errors import EngineUnavailable
from .residency import cubin_text_bytes


class Launcher:
    """Binds the engine's buffers and constants to ``kernel.megakernel`` (a Triton or Gluon JIT function) and
    launches it.

    ``args``: every non-constexpr argument except the per-launch ones (table, counts, max_tasks, timeline,
    advance, tok_in); ``constexprs``: the compile-time ones; ``options``: launch options (``num_warps``,
    ``launch_cooperative_grid``, ``num_stages``, ``maxnreg``); ``info``: fields added to :meth:`compile`'s report;
    ``ptx_rewrite``: a PTX text rewrite (str → str, e.g.
    ``gluon.ptx.tma_l2_evict_first``) applied while this launcher compiles, and ``ptx_check`` (PTX or None → the
    reason it lacks the rewrite, or None) run on the binary's PTX after; ``pack``: the arguments by name (``args``
    and the per-launch ones) → the kernel's (e.g. ``gluon.host.pack_args``, which groups them into the Gluon
    kernel's tuples), None where the kernel takes them as named. With ``fast`` the compiled kernel is
    called directly
    after the first launch (Triton's own launch path re-binds and re-specialises ~40 arguments on every call);
    the per-launch integers are marked ``do_not_specialize`` so one binary serves every table and token.
    """

    def __init__(self, kernel, args: dict, constexprs: dict, options: dict, fast: bool, info: dict | None = None,
                 ptx_rewrite=None, ptx_check=None, pack=None):
        self.kernel = kernel
        self.pack = pack
        self.ptx_rewrite, self.ptx_check = ptx_rewrite, ptx_check
        self.args = dict(args)
        self.constexprs = dict(constexprs)
        self.options = dict(options)
        self.fast, self.info = fast, dict(info or {})
        self.compiled = None
        self._names = list(kernel.megakernel.arg_names)
        self._fast_calls: dict[tuple, tuple] = {}  # (grid, table, timeline, advance) -> (runner, ordered args)
        self._tok_index = self._names.index("tok_in")

    def _all(self, table, counts, timeline, advance, tok_in=-1) -> dict:
        args = dict(self.args, **self.constexprs, table_ptr=table, counts_ptr=counts, max_tasks=int(table.shape[1]),
                    timeline_ptr=timeline, advance=int(advance), tok_in=int(tok_in))
        return args if self.pack is None else self.pack(args)

    def compile(self, table, counts, timeline) -> dict:
        """Compile (no launch) and load the binary; returns registers, spills, shared memory, warps, machine-code
        bytes (``text_bytes``), cooperative and :attr:`info`.

        Raises:
            EngineUnavailable: the binary does not fit the device (shared memory, threads per block), or
                ``ptx_check`` finds it without its rewrite (e.g. from Triton's cache, compiled elsewhere without).
        """
        with self._rewriting():
            ck = self.kernel.megakernel.warmup(grid=(1,), **self.options, **self._all(table, counts, timeline, 0))
            if hasattr(ck, "result"):
                ck = ck.result()
        why = self.ptx_check(ck.asm.get("ptx")) if self.ptx_check is not None else None
        if why:  # e.g. a binary from Triton's cache compiled elsewhere without the rewrite
            raise EngineUnavailable(f"megakernel: the compiled binary lacks its PTX rewrite: {why}; clear Triton's "
                                    "cache (~/.triton/cache) and retry")
        from triton.runtime.errors import OutOfResources
        try:
            ck._init_handles()
        except OutOfResources as e:  # shared memory or threads beyond the device's per-block limits
            raise EngineUnavailable(f"megakernel does not fit the device: {e}") from None
        self.compiled = ck
        cubin = ck.asm.get("cubin")
        return {"registers": int(ck.n_regs), "spills": int(ck.n_spills), "shared_bytes": int(ck.metadata.shared),
                "num_warps": int(ck.metadata.num_warps),
                "text_bytes": sum(cubin_text_bytes(cubin).values()) if cubin else None,
                "cooperative": bool(getattr(ck.metadata, "launch_cooperative_grid", False)), **self.info}

    def __call__(self, grid: int, table, counts, timeline, advance: int, tok_in: int = -1) -> None:
        """Launch on ``grid`` programs; ``tok_in`` >= 0 is the step's input token, -1 reads ``state[2]``."""
        if self.fast and self.compiled is not None:
            key = (grid, table.data_ptr(), timeline.data_ptr(), advance)
            call = self._fast_calls.get(key)
            if call is None:  # the engine's buffers never move, so the bound argument list can be reused
                args = self._all(table, counts, timeline, advance)
                call = self._fast_calls[key] = (self.compiled[(grid, 1, 1)], [args[n] for n in self._names])
            call[1][self._tok_index] = int(tok_in)
            call[0](*call[1])
        else:
            with self._rewriting():  # a first call compiles
                self.kernel.megakernel[(grid,)](**self.options, **self._all(table, counts, timeline, advance, tok_in))

    def _rewriting(self):
        return contextlib.nullcontext() if self.ptx_rewrite is None else rewriting(self.ptx_rewrite)


@contextlib.contextmanager
def rewriting(rewrite):
    """Within the block, every kernel Triton compiles has its PTX passed through ``rewrite`` (str → str) before
    ``ptxas``; an inspection hook already installed still runs first. Only compiles, not cached binaries, see it,
    so a kernel whose PTX the rewrite changes must differ in its cache key (the Gluon kernel: the ``TMA_EVICT``
    constexpr)."""
    import triton
    prev = triton.knobs.runtime.add_stages_inspection_hook

    def hook(backend, stages, options, language, capability):
        if prev is not None:
            prev(backend, stages, options, language, capability)
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: rewrite(make_ptx(src, metadata))

    triton.knobs.runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        triton.knobs.runtime.add_stages_inspection_hook = prev

