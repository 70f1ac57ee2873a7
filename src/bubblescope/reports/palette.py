"""One fixed palette for every figure: a colour (and for lines a marker) per engine, kernel category and megakernel
opcode, keyed by name, so that "megakernel" or "attention" is the same colour in every report and every figure.

Colours of the known names come from matplotlib's ``tab10``/``tab20`` (Tableau; distinguishable in print and by
most colour-blind readers); a name the palette does not know (a new engine, a category from someone else's trace)
gets a colour picked by a stable hash of the name (CRC-32) from the colours no known name uses, so it too keeps
its colour from one report to the next. Red (:data:`LIMIT`) is kept for limits (the NVML peak and the floors).
"""

from __future__ import annotations

import zlib

LIMIT = "#c44e52"          # bandwidth ceilings and floors
WAIT = "#a0a0a0"           # a megakernel task waiting on a dependency
IDLE = "#ececec"           # a program with no task

ENGINES = {
    "reference": "#1f77b4", "reference-cudagraph": "#17becf", "reference-compile": "#2ca02c",
    "reference-fused": "#bcbd22", "reference-fused-pdl": "#8c564b", "hf": "#7f7f7f",
    "megakernel-stages": "#9467bd", "megakernel-noprefetch": "#e377c2", "megakernel": "#ff7f0e",
    "megakernel-gluon": "#d62728", "megakernel-triton": "#e6ab02",
}
# The categories of bubblescope.profiler.trace.categories (CATEGORY_NAMES), and the short names older traces used.
CATEGORIES = {
    "gemm/gemv": "#4c72b0", "gemm": "#4c72b0", "gemv": "#4c72b0", "attention": "#dd8452", "norm": "#55a868",
    "rope": "#8172b3", "elementwise/activation": "#937860", "elementwise": "#937860",
    "reduction/sampling": "#da8bc3", "copy/memset": "#8c8c8c", "communication": "#ccb974", "megakernel": "#64b5cd",
    "other": "#c7c7c7",
}
# Megakernel opcodes (megakernel_engine.schedule.OPCODE_NAMES), matched without case.
OPCODES = {"qkv": "#4c72b0", "attn": "#dd8452", "attn_reduce": "#f2b880", "oproj": "#55a868", "gateup": "#8172b3",
           "mlp": "#8172b3", "down": "#937860", "lmhead": "#da8bc3", "lm_head": "#da8bc3", "nop": "#c7c7c7"}
# Colours for names none of the tables above knows (tab20's pairs and Set2, less those used above).
_SPARE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39", "#ad494a",
          "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd", "#66c2a5", "#fc8d62", "#8da0cb")
# Line markers per engine, so that lines drawn over each other (two engines that measure the same) stay visible.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
_ENGINE_MARKERS = {name: _MARKERS[i % len(_MARKERS)] for i, name in enumerate(ENGINES)}


def _spare(name: str) -> str:
    return _SPARE[zlib.crc32(str(name).encode("utf-8", "surrogateescape")) % len(_SPARE)]


def engine_colour(name: str) -> str:
    """The colour of engine ``name`` (a ``#rrggbb`` string): fixed for the known engines, else stable by name."""
    return ENGINES.get(str(name)) or _spare(name)


def engine_marker(name: str) -> str:
    """The matplotlib marker of engine ``name``'s lines: fixed for the known engines, else stable by name."""
    return _ENGINE_MARKERS.get(str(name)) or _MARKERS[zlib.crc32(str(name).encode("utf-8", "surrogateescape"))
                                                       % len(_MARKERS)]


def category_colour(name: str) -> str:
    """The colour of kernel category ``name``: fixed for bubblescope's categories, else stable by name."""
    return CATEGORIES.get(str(name)) or _spare(name)


def opcode_colour(name: str) -> str:
    """The colour of megakernel opcode ``name`` (any case): fixed for the known opcodes, else stable by name."""
    return OPCODES.get(str(name).lower()) or _spare(str(name).lower())


def colours(names, of=category_colour) -> dict:
    """``{name: colour}`` for ``names`` in their order (``of`` one of the functions above)."""
    return {name: of(name) for name in names}
