"""The period of a sequence that repeats once per decode step: the step-finding core of :mod:`.stepfind`.

Pure numpy on a sequence of unit codes (kernels or operators in issue order). Cut at each occurrence of a
unit, the sequence falls into segments; for the unit that occurs once per step, most segments are the same
sequence, compared by a position-weighted hash of their units (so order counts). The unit that cuts the most
units into identical segments gives the period; the boundary is then shifted to where the host pauses between
tokens (:func:`repeating_steps`). Segments from the first to the last identical one are the steps; those before
are prefill and warm-up (a first period that differs). Fewer than :data:`MIN_STEPS` repeats, or repeats that
cover less than :data:`MIN_COVERAGE` of the units, are no period: no steps are made up.

A step whose kernels change from token to token in a cycle repeats exactly only every few tokens (Hugging Face
``generate`` of Llama-3.2-1B on an H100: 9 steps of 2,856 kernels found in a 40-token window). When the exact period of ``L`` units holds
``k`` occurrences of another unit, each ``L / k`` units apart, that finer period is the step: its steps all have one
length, in a few variants (:func:`_finer_period`). Where no unit occurs once per cycle (the changing kernel runs in
every layer), the once-per-token unit's segments repeat their sequence every ``k`` segments: those segments are the
steps, in ``k`` variants of one length or of lengths within :data:`CYCLE_LENGTH_SPREAD` of each other (a variant
that launches an extra kernel) (:func:`_cycled`). Variants further apart than that, where one unit occurs once per
cycle, make the exact period several tokens long; when the host pauses between tokens (sampling, a sync) and
nowhere else as long, those pauses cut it into its tokens (:func:`_pause_split`). A kernel picked by the context
length changes the sequence partway through a run; the steps run on through such a change (:func:`_phase_span`:
Hugging Face ``generate`` of a 2-layer float32 Llama on an H100 gave 10 steps in a 20-token window when they
stopped at the first token whose softmax kernel had changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...wording import count
from .intervals import unique_ints

if TYPE_CHECKING:
    import numpy as np

MIN_STEPS = 3  # fewer repeats cannot tell a period from a coincidence
MIN_COVERAGE = 0.5  # the steps must hold at least this share of the units, or the "period" is a detail
_MAX_SHIFTS = 4096  # step boundaries tried per anchor (all of them for steps of up to this many units)
MAX_CYCLE = 8  # most variants of a step that cycle from token to token (:func:`_cycled`)
_CYCLE_SHARE = 0.9  # least share of an anchor's segments that must equal the one k segments later
# Most a cycle's variants may differ in length, relative to the shortest. A unit repeated per layer in a model of
# at most MAX_CYCLE layers also cycles, and must not pass: its segment across the token's own units (final norm,
# LM head, sampling: ~15 kernels against ~37 a layer in an eager Llama) is far longer than the others, while a token
# variant differs by a kernel per layer at most (~3 % of the token).
CYCLE_LENGTH_SPREAD = 0.05
# Token boundaries told by the host's pauses (:func:`_pause_split`): where a step of the exact period holds pauses
# as long as the one before it, and the work between them has none, the step is several tokens. Structure alone
# cannot tell two tokens in variants (A, B) from one token of two identical layers with a tail (L, L+tail); a loop
# that syncs or samples on the host between tokens can, where every piece begins and ends with the step's own first
# and last units (a sync in every layer cuts a token into pieces that begin with a layer's unit, not the token's).
PAUSE_SHARE = 0.5        # a pause inside a step at least this share of the pause before the step is a boundary
PAUSE_OVER_WORK = 5.0    # ... and the pause before the step at least this many times the typical gap inside it
PAUSE_MIN_US = 20.0      # and at least this long, µs (the host's work between tokens: sampling, a sync)
PIECE_SPREAD = 0.5       # the tokens so split differ in length by at most this share of the shortest
_HASH_SEED = 0x5EED_0D1E


def _prefix_hashes(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefix sums (uint64, wrapping) of two random values per distinct token, the second also weighted by
    position, from which :func:`_segment_hash` gets any segment's hash in O(1)."""
    import numpy as np

    _, code = unique_ints(tokens)
    rng = np.random.default_rng(_HASH_SEED)
    rand_a = rng.integers(1, 1 << 63, size=int(code.max()) + 1, dtype=np.uint64)
    rand_b = rng.integers(1, 1 << 63, size=int(code.max()) + 1, dtype=np.uint64)
    a, b = rand_a[code], rand_b[code]
    zero = np.zeros(1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (np.concatenate([zero, np.cumsum(a, dtype=np.uint64)]),
                np.concatenate([zero, np.cumsum(b, dtype=np.uint64)]),
                np.concatenate([zero, np.cumsum(b * np.arange(len(tokens), dtype=np.uint64), dtype=np.uint64)]))


def _segment_hash(h: tuple, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Hash (uint64) of each segment [start, end) of the tokens: the sum of its tokens' first values, the sum of
    their second values weighted by position within the segment, and its length, mixed. Equal sequences hash
    equal; different ones collide with probability about 2^-64."""
    import numpy as np

    a, b, c = h
    s, e = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    su = s.astype(np.uint64)
    with np.errstate(over="ignore"):
        h1 = a[e] - a[s]
        h2 = (c[e] - c[s]) - su * (b[e] - b[s])
        length = (e - s).astype(np.uint64)
        return h1 ^ (h2 * np.uint64(0x9E3779B97F4A7C15)) ^ (length * np.uint64(0xC2B2AE3D27D4EB4F))


def _not_found(reason: str, n: int) -> dict:
    return {"found": False, "reason": reason, "units": n}


def repeating_steps(tokens: np.ndarray, gap_before: np.ndarray, min_steps: int = MIN_STEPS,
                    min_coverage: float = MIN_COVERAGE) -> dict:
    """Steps of a unit sequence that repeats once per step (the algorithm of the module doc).

    Args:
        tokens: (n,) int64, one code per unit in issue order (equal codes: the same kernel or operator).
        gap_before: (n,) float64 µs, host time between the previous unit's end and this unit's start (the
            step boundary is put where it is longest).
        min_steps: fewest identical segments that make a period.
        min_coverage: least share of the units the steps must hold.

    Returns:
        ``{"found": True, "starts", "ends": int64 arrays (unit index of each step's first unit, and one past
        its last), "matching": bool array (the step is the common sequence exactly), "length": units in the
        common sequence, "anchor": the token of each step's first unit, "prefix": units before the first step,
        "suffix": units after the last, "coverage": share of the units in steps as long as the common
        sequence, "units": n, "reason": None, "cycle": 1, or k when the sequence repeats exactly only every k
        steps, "variants": distinct sequences among the steps of the common length(s), "lengths": the variants'
        lengths (one unless they differ by an extra unit or so: then "length" is the shortest and "matching"
        means "as long as a variant")}``,
        or ``{"found": False, "reason": str, "units": n}``.
    """
    import numpy as np

    tokens = np.asarray(tokens)
    n = len(tokens)
    if n < min_steps:
        return _not_found(f"only {count(n, 'unit')}: too few to repeat {min_steps} times", n)
    gap_before = np.asarray(gap_before, dtype=float)
    h = _prefix_hashes(tokens)
    values, code = unique_ints(tokens)
    order = np.argsort(code, kind="stable")  # positions grouped by token, ascending within each
    bounds = np.concatenate([[0], np.cumsum(np.bincount(code, minlength=len(values)))])
    candidates = []  # (units covered, step length, repeats or k, median gap, anchor, cycle, variant lengths)
    for c in np.flatnonzero(np.diff(bounds) >= min_steps).tolist():
        p = order[bounds[c]:bounds[c + 1]]
        sig = _segment_hash(h, p[:-1], p[1:])
        uniq, counts = np.unique(sig, return_counts=True)
        common = uniq[counts.argmax()]
        same = sig == common
        length = int(p[1:][same][0] - p[:-1][same][0])
        tail = p[-1] + length <= n and _segment_hash(h, p[-1:], p[-1:] + length)[0] == common
        repeats = int(counts.max()) + int(tail)
        if repeats >= min_steps:
            candidates.append((repeats * length, length, repeats, float(np.median(gap_before[p[:-1][same]])), c, 1,
                               (length,)))
        # k variants of one step, when one sequence alone leaves more than a tenth of the segments out
        cycled = _cycled(h, p, sig, n, min_steps) if counts.max() < _CYCLE_SHARE * len(sig) else None
        if cycled is not None and cycled[0] >= repeats * length:   # a tie: the finer step (its variants) wins
            covered, short, k, lengths = cycled
            candidates.append((covered, short, k, float(np.median(gap_before[p[:-1]])), c, k, lengths))
    if not candidates:
        return _not_found(f"no sequence of units repeats {min_steps} times or more", n)
    _, length, _, _, c, cycle, lengths = max(candidates, key=lambda t: (t[0], -t[1], t[3]))
    finer = _finer_period(h, order, bounds, c, length, min_steps) if cycle == 1 else None
    if finer is not None:
        c, cycle = finer
        length //= cycle
        lengths = (length,)
    starts, ends, matching = _aligned(h, order[bounds[c]:bounds[c + 1]], length, gap_before)
    if cycle > 1:  # the steps of the variants' lengths are the common step, in variants
        if len(starts) > cycle:  # the last step as long as its variant k steps before, not the shortest
            ends[-1] = min(int(starts[-1] + ends[-1 - cycle] - starts[-1 - cycle]), n)
        matching = np.isin(ends - starts, lengths)
    if cycle == 1:  # a step whose sequence changes as the run goes on: the steps run on through each phase
        first, last, matching = _phase_span(_segment_hash(h, starts, ends), ends - starts, matching, lengths)
    else:
        first, last = int(np.argmax(matching)), len(matching) - 1 - int(np.argmax(matching[::-1]))
    starts, ends, matching = starts[first:last + 1], ends[first:last + 1], matching[first:last + 1]
    split = _pause_split(tokens, starts, ends, matching, length, gap_before) if cycle == 1 else None
    if split is not None:  # the exact period held several tokens, told apart by the host's pauses
        starts, ends, cycle, lengths = split
        starts, ends = _edge_tokens(h, starts, ends, lengths, n)
        length = lengths[0]
        matching = np.isin(ends - starts, lengths)
    # steps of the common length (the same calls, maybe other kernels: a context that changes the attention
    # kernel) must hold most units; a short motif repeating inside one long pass is not a step
    regular = np.isin(ends - starts, lengths)
    coverage = float((ends - starts)[regular].sum() / n)
    if coverage < min_coverage:
        return _not_found(f"the most repeated sequence ({count(length, 'unit')}, {int(matching.sum())} times) "
                          f"covers only {coverage:.0%} of the {n} units", n)
    variants = len(np.unique(_segment_hash(h, starts[regular], ends[regular])))
    return {"found": True, "starts": starts.astype(np.int64), "ends": ends.astype(np.int64), "matching": matching,
            "length": length, "anchor": values[c], "prefix": int(starts[0]), "suffix": int(n - ends[-1]),
            "coverage": coverage, "units": n, "reason": None, "cycle": cycle, "variants": variants,
            "lengths": [int(v) for v in sorted(set(lengths))]}


def _phase_span(sig: np.ndarray, seg_len: np.ndarray, matching: np.ndarray,
                lengths: tuple[int, ...]) -> tuple[int, int, np.ndarray]:
    """(first, last, matching) of the steps among the segments (hashes ``sig``, lengths ``seg_len``) whose
    common sequence is ``matching``.

    A kernel picked by the context length (a softmax specialised by the keys' count, an attention kernel for longer
    contexts) changes the step's sequence partway through a run: the tokens after the change are steps as much as
    those before it, only of another phase. So from the segments that are the common sequence, the steps run on
    forward through every segment of a step's length, and back through those that repeat a neighbour's sequence
    exactly (an earlier phase); a lone segment unlike the one after it at the front (a prefill of the same
    calls, a warm-up step) stays out. ``matching`` becomes: the segment repeats a neighbour's sequence (its
    phase's) or is the common one."""
    import numpy as np

    regular = np.isin(seg_len, lengths)
    first, last = int(np.argmax(matching)), len(matching) - 1 - int(np.argmax(matching[::-1]))
    while last + 1 < len(sig) and regular[last + 1]:
        last += 1
    while first > 0 and regular[first - 1] and (sig[first - 1] == sig[first] or
                                                (first > 1 and sig[first - 1] == sig[first - 2])):
        first -= 1
    repeats = np.zeros(len(sig), dtype=bool)
    same = sig[1:] == sig[:-1]
    repeats[1:] |= same
    repeats[:-1] |= same
    return first, last, matching | (repeats & regular)


def _finer_period(h: tuple, order: np.ndarray, bounds: np.ndarray, c: int, length: int,
                  min_steps: int) -> tuple[int, int] | None:
    """(anchor, k) of the finest period inside the exact one (``length`` units, anchor ``c``), or None: an anchor
    whose segments are mostly (90 %) one length ``length / k``, k ≥ 2, and that occurs exactly k times in every
    segment of the exact period that is its common sequence. A unit repeated per layer does not qualify: with
    the token's own units (LM head, sampling) in one of its segments, the layers' length does not divide the
    step's, or their count per step is not the quotient."""
    import numpy as np

    p = order[bounds[c]:bounds[c + 1]]
    sig = _segment_hash(h, p[:-1], p[1:])
    uniq, counts = np.unique(sig, return_counts=True)
    exact = sig == uniq[counts.argmax()]
    lo, hi = p[:-1][exact], p[1:][exact]
    best = None
    for c2 in np.flatnonzero(np.diff(bounds) >= 2 * min_steps).tolist():
        if c2 == c:
            continue
        q = order[bounds[c2]:bounds[c2 + 1]]
        lengths, times = np.unique(np.diff(q), return_counts=True)
        step = int(lengths[times.argmax()])
        if times.max() < 0.9 * (len(q) - 1) or length % step or length // step < 2:
            continue
        k = length // step
        inside = np.searchsorted(q, hi) - np.searchsorted(q, lo)
        if (inside == k).all() and (best is None or k > best[1]):
            best = (c2, k)
    return best


def _cycled(h: tuple, p: np.ndarray, sig: np.ndarray, n: int,
            min_steps: int) -> tuple[int, int, int, tuple[int, ...]] | None:
    """(units covered, shortest segment length, k, the variants' lengths) where the segments between the anchor's
    occurrences ``p`` (hashes ``sig``) cycle through k ≥ 2 variants, or None.

    The smallest k in [2, :data:`MAX_CYCLE`] for which at least :data:`_CYCLE_SHARE` of the segments equal the one
    k segments later. The segments in such a pair are the cycle's; their lengths must lie within
    :data:`CYCLE_LENGTH_SPREAD` of the shortest (a unit repeated per layer fails here: its segment across the
    token's own units is much longer than the layers'), they must hold at least two distinct sequences and at
    least ``min_steps`` pairs. The segment after the last occurrence counts when it is the one k segments before
    it, as the exact period's tail does."""
    import numpy as np

    seg_len = np.diff(p)
    for k in range(2, min(MAX_CYCLE, len(sig) - 1) + 1):
        pair = sig[:-k] == sig[k:]
        if pair.sum() < max(1, _CYCLE_SHARE * len(pair)):
            continue
        inside = np.zeros(len(sig), dtype=bool)
        inside[:-k] |= pair
        inside[k:] |= pair
        lengths = np.unique(seg_len[inside])
        if lengths[-1] - lengths[0] > CYCLE_LENGTH_SPREAD * lengths[0] or len(np.unique(sig[inside])) < 2:
            continue
        last = int(seg_len[-k])   # the tail is the variant k segments before it
        tail = p[-1] + last <= n and _segment_hash(h, p[-1:], p[-1:] + last)[0] == sig[-k]
        if int(pair.sum()) + int(tail) < min_steps:
            continue
        covered = int(seg_len[inside].sum()) + last * int(tail)
        return covered, int(lengths[0]), k, tuple(int(v) for v in lengths)
    return None


def _pause_split(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, matching: np.ndarray, length: int,
                 gap_before: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, tuple[int, ...]] | None:
    """(starts, ends, k, piece lengths) of the steps cut into the k tokens each holds, or None.

    Over the steps that are the common sequence (``length`` units), the median host gap at each offset: offset 0
    is the pause before a step; every other offset whose median is at least :data:`PAUSE_SHARE` of it is a token
    boundary too, when that pause is at least :data:`PAUSE_MIN_US` and :data:`PAUSE_OVER_WORK` times the median
    gap at the remaining offsets, and the pieces' lengths lie within :data:`PIECE_SPREAD` of the shortest (a sync
    between a model's layers and its LM head leaves pieces far apart in length). Each piece must also begin with
    the unit the step begins with and end with the unit it ends with: tokens of one loop start and finish with the
    same calls (embedding, sampling), their variants differ inside the model, while a host sync in every layer
    (a routing ``.item()``, ``nonzero``) cuts a token into layers that begin and end elsewhere. Every step of the
    common length is cut at the same offsets; another (a token that launched an extra kernel) where it holds such a
    boundary too: a pause of that share before the step's first unit, after its last."""
    import numpy as np

    exact = starts[matching & (ends - starts == length)]  # the common sequence may be of another length, rarely
    if len(exact) < MIN_STEPS or length < 2:
        return None
    typical = np.median(gap_before[exact[:, None] + np.arange(length)], axis=0)   # (length,) µs
    lead = float(typical[0])
    inner = np.flatnonzero(typical[1:] >= PAUSE_SHARE * lead) + 1
    if lead < PAUSE_MIN_US or not len(inner):
        return None
    work = np.delete(typical[1:], inner - 1)
    if len(work) and lead < PAUSE_OVER_WORK * float(np.median(work)):
        return None
    cuts = np.concatenate([[0], inner, [length]])
    pieces = np.diff(cuts)
    if pieces.max() > (1 + PIECE_SPREAD) * pieces.min():
        return None
    tokens = np.asarray(tokens)
    step = tokens[int(exact[0]):int(exact[0]) + length]
    if (step[cuts[:-1]] != step[0]).any() or (step[cuts[1:] - 1] != step[-1]).any():
        return None
    # where a token may begin inside a step of another length: after the step's last unit, with its first unit,
    # after a pause as long as the common steps' inner boundaries
    begins = np.zeros(len(tokens), dtype=bool)
    begins[1:] = (tokens[1:] == step[0]) & (tokens[:-1] == step[-1]) & (gap_before[1:] >= PAUSE_SHARE * lead)
    bounds = [s + cuts if e - s == length else np.concatenate([[s], s + 1 + np.flatnonzero(begins[s + 1:e]), [e]])
              for s, e in zip(starts.tolist(), ends.tolist())]
    new_starts = np.concatenate([b[:-1] for b in bounds])
    new_ends = np.concatenate([b[1:] for b in bounds])
    return (new_starts.astype(np.int64), new_ends.astype(np.int64), len(pieces),
            tuple(int(v) for v in sorted(set(pieces.tolist()))))


def _edge_tokens(h: tuple, starts: np.ndarray, ends: np.ndarray, lengths: tuple[int, ...],
                 n: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the tokens cut from the exact period (:func:`_pause_split`), with the whole tokens just
    before the first and after the last added: the steps of a period of k tokens run from one of its starts to
    one of its ends, so up to k - 1 tokens at each end of the trace (a period begun before the trace or not
    finished in it) would be left out. Added: each segment next to the steps that is one of the tokens' own
    sequences (their lengths ``lengths``), until one is not."""
    import numpy as np

    seen = _segment_hash(h, starts, ends)
    known = set(seen[np.isin(ends - starts, lengths)].tolist())
    before, after = [], []
    s = int(starts[0])
    while True:
        size = next((v for v in lengths if v <= s and int(_segment_hash(h, [s - v], [s])[0]) in known), None)
        if size is None:
            break
        s -= size
        before.insert(0, s)
    e = int(ends[-1])
    while True:
        size = next((v for v in lengths if e + v <= n and int(_segment_hash(h, [e], [e + v])[0]) in known), None)
        if size is None:
            break
        after.append(e)
        e += size
    if not before and not after:
        return starts, ends
    new_starts = np.concatenate([before, starts, after]).astype(np.int64)
    new_ends = np.concatenate([np.append(before[1:], starts[0]) if before else [], ends,
                               np.append(after[1:], e) if after else []]).astype(np.int64)
    return new_starts, new_ends


def _aligned(h: tuple, p: np.ndarray, length: int, gap_before: np.ndarray) -> tuple[np.ndarray, ...]:
    """(starts, ends, matching) of the segments cut ``d`` units before each occurrence ``p`` of the anchor.

    The anchor need not be a step's first unit (a loop whose once-per-token calls come after its layers), so
    every ``d`` in [0, length) is tried: the boundary goes after the longest median host gap (where a token
    ends: sampling, a sync) when that gap is at least twice the one of the ``d`` that makes the most segments
    the common sequence and loses at most one of them; else that ``d`` (a trace cut mid-step loses a step at
    each end otherwise)."""
    import numpy as np

    n = len(gap_before)
    shifts = np.arange(length)
    if length > _MAX_SHIFTS:  # a very long step: try only the boundaries after the longest gaps
        typical = np.array([np.median(gap_before[np.clip(p - d, 0, n - 1)]) for d in range(length)])
        shifts = np.sort(np.argsort(-typical, kind="stable")[:_MAX_SHIFTS])
    tried = []
    for d in shifts.tolist():
        starts = p[p >= d] - d
        if not len(starts):
            continue
        ends = np.append(starts[1:], min(int(starts[-1]) + length, n))
        sig = _segment_hash(h, starts, ends)
        uniq, counts = np.unique(sig, return_counts=True)
        matching = sig == uniq[counts.argmax()]
        tried.append((int(counts.max()), float(np.median(gap_before[starts[matching]])), -d, starts, ends, matching))
    most = max(tried, key=lambda t: t[:3])
    gap = max((t for t in tried if t[0] >= most[0] - 1), key=lambda t: t[1:3])
    pick = gap if gap[1] > 0 and gap[1] >= 2 * most[1] else most
    return pick[3], pick[4], pick[5]


def confidence(steps: int, matching: int, coverage: float) -> str:
    """``high`` (8 steps or more, 90 % of them the common sequence exactly, 80 % of the units in steps),
    ``medium`` (70 % exact, half the units) or ``low``: how much the step count can be trusted."""
    share = matching / steps if steps else 0.0
    if steps >= 8 and share >= 0.9 and coverage >= 0.8:
        return "high"
    return "medium" if share >= 0.7 and coverage >= 0.5 else "low"
