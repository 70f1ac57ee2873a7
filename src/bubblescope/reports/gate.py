"""CI gate: check one engine of a results document against limits, and optionally against a baseline.

Exit codes (``GateReport.exit_code``; the CLI exits with it): 0 every check holds, 1 a check fails.
A metric that is null (not measured) fails its check: a gate that cannot see must not pass.
Unusable input — an invalid document, an unknown engine, an engine that did not run, a bad limit,
or no check requested at all — raises :class:`BubblescopeError`, which the CLI turns into exit 2,
so a misconfigured CI job is never mistaken for a pass or for a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import BubblescopeError
from .ladder import bubble_ratio
from .results import Results, dig, validate_results
from ..wording import count, plural


@dataclass(frozen=True)
class Check:
    """One gate check. ``measured`` and ``limit`` are in the metric's unit (fraction, ms, GB/s)."""

    name: str
    engine: str
    measured: float | None
    limit: float | None
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateReport:
    """The checks run on one engine, in the order requested."""

    engine: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """True when every check holds."""
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 when every check holds, 1 when one fails."""
        return 0 if self.passed else 1


def _as_doc(results: Results | dict, what: str) -> dict:
    doc = results.doc if isinstance(results, Results) else results
    problems = validate_results(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BubblescopeError(f"{what}: invalid results document: {problems[0]}{more}")
    return doc


def _pick_engine(doc: dict, name: str | None) -> dict:
    res = Results(doc)
    if name is not None:
        eng = res.engine(name)
        if eng["status"] != "ok":
            raise BubblescopeError(f"engine {name!r}: status {eng['status']} ({eng.get('reason')}); nothing to gate")
        return eng
    ok = res.ok_engines
    if not ok:
        raise BubblescopeError("results: no engine with status ok to gate")
    mega = [e for e in ok if e["name"] == "megakernel"]
    if mega:
        return mega[0]
    timed = [e for e in ok if dig(e, "latency", "token_ms_p50") is not None]
    return min(timed, key=lambda e: e["latency"]["token_ms_p50"]) if timed else ok[0]


def _limit(name: str, value: float | None, upper: float | None = None) -> None:
    if value is None:
        return
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
    if bad or (upper is not None and value > upper):
        span = f"in [0, {upper}]" if upper is not None else ">= 0"
        raise BubblescopeError(f"--{name.replace('_', '-')}: must be a number {span}, got {value!r}"
                               f"{percent_hint(name, value) if not bad else ''}")


def check_limits(min_bandwidth_util: float | None, max_bubble_ratio: float | None, max_token_p99_ms: float | None,
                 max_regression: float | None, baseline) -> None:
    """The gate's limits as given, before any document is read (results.json and trace results alike).

    Fractions, not percentages: a limit of 35 meant as 35 % would make every run fail (or pass), so fraction limits
    above 1 are refused with a hint.

    Raises:
        BubblescopeError: a limit negative, not finite or not a number; a fraction limit above 1; ``baseline`` and
            ``max_regression`` not given together; no check requested at all.
    """
    _limit("min_bandwidth_util", min_bandwidth_util, upper=1)
    _limit("max_bubble_ratio", max_bubble_ratio, upper=1)
    _limit("max_token_p99_ms", max_token_p99_ms)
    _limit("max_regression", max_regression, upper=1)
    if (baseline is None) != (max_regression is None):
        raise BubblescopeError("gate: --baseline and --max-regression must be given together")
    if all(v is None for v in (min_bandwidth_util, max_bubble_ratio, max_token_p99_ms, baseline)):
        raise BubblescopeError("gate: no checks requested (give --min-bandwidth-util, --max-bubble-ratio, "
                               "--max-token-p99-ms or --baseline with --max-regression)")


# What must match between a run and its baseline for a regression check to mean anything: the model by name,
# by its architecture (the config.json fields that set the bytes and the kernels: two runs both named "model"
# of 2 and 16 layers are two workloads) and by its size, the dtype, the device and the workload.
ARCHITECTURE = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")
COMPARABLE = (("model", ("model", "name")),
              *((key, ("model", "config", key)) for key in ARCHITECTURE),
              ("parameters", ("model", "parameters")), ("weight_bytes", ("model", "weight_bytes")),
              ("dtype", ("model", "dtype")), ("device", ("device", "name")),
              ("prompt_len", ("workload", "prompt_len")), ("gen_len", ("workload", "gen_len")))


def baseline_mismatches(doc: dict, baseline: dict) -> list[str]:
    """``"model: llama-3.2-1b vs baseline stories260k"`` for each of :data:`COMPARABLE` that differs between a
    results document and its baseline: model name, architecture (``model.config``'s :data:`ARCHITECTURE`
    fields, compared where both documents record a config: it may be null), parameter count and weight bytes
    (null where not recorded), dtype, device name, prompt and generation length. Empty when comparable."""
    out = []
    for label, path in COMPARABLE:
        if path[:2] == ("model", "config") and (dig(doc, "model", "config") is None
                                                or dig(baseline, "model", "config") is None):
            continue
        new, old = dig(doc, *path), dig(baseline, *path)
        if new != old:
            out.append(f"{label}: {new} vs baseline {old}")
    return out


def percent_hint(name: str, value: float | None, upper: float = 1.0) -> str:
    """A hint when a fraction limit looks like a percentage (35 for 0.35), else ""."""
    if value is not None and upper < value <= 100:
        return f" (--{name.replace('_', '-')} is a fraction: did you mean {value / 100:g} for {value:g} %?)"
    return ""


# How each check's numbers are shown: (unit, scale, fewest decimals). Fractions as percentages, as the reports show
# them; latencies in ms with 3 decimals; bandwidths in whole GB/s.
_UNITS = {"min_bandwidth_util": ("%", 100, 1), "max_bubble_ratio": ("%", 100, 1), "max_token_p99_ms": ("ms", 1, 3),
          "regression_token_ms_p50": ("ms", 1, 3), "regression_effective_GBps": ("GB/s", 1, 0)}


def show(name: str, *values: float | None) -> list[str]:
    """``values`` of check ``name`` with its unit (``64.5 %``, ``0.830 ms``, ``2,994 GB/s``), with as many
    decimals as it takes (up to 6) for values that differ to read differently: a check failing by a hair never
    reads "64.5 % < 64.5 %". None shows as "—"."""
    unit, scale, decimals = _UNITS.get(name, ("", 1, 3))
    nums = [v * scale for v in values if v is not None]
    while decimals < 6 and len({f"{v:.{decimals}f}" for v in nums}) < len(set(nums)):
        decimals += 1
    return ["—" if v is None else f"{v * scale:,.{decimals}f}{' ' + unit if unit else ''}" for v in values]


def _check(name: str, engine: str, measured: float | None, limit: float, holds, what: str) -> Check:
    if measured is None:
        return Check(name, engine, None, limit, False, f"{what} not measured (null): failing closed")
    ok = bool(holds(measured, limit))
    m, lim = show(name, measured, limit)
    return Check(name, engine, measured, limit, ok, f"{what} {m}, limit {lim}: {'holds' if ok else 'fails'}")


def run_gate(doc: Results | dict, engine: str | None = None, min_bandwidth_util: float | None = None,
             max_bubble_ratio: float | None = None, max_token_p99_ms: float | None = None,
             baseline: Results | dict | None = None, max_regression: float | None = None,
             allow_mismatch: bool = False) -> GateReport:
    """Check one engine of a results document.

    Checks (each only when its limit is given):
      * ``min_bandwidth_util``: ``bandwidth.util_peak`` (fraction of NVML peak) >= limit;
      * ``max_bubble_ratio``: the bubble ratio the reports show (fraction, :func:`.ladder.bubble_ratio`: a
        one-kernel step's in-kernel wait, else ``timeline.bubble_ratio``) <= limit;
      * ``max_token_p99_ms``: ``latency.token_ms_p99`` (ms) <= limit;
      * with ``baseline`` and ``max_regression`` (a fraction, 0.05 = 5 %), against the same engine of
        the baseline: ``token_ms_p50`` new <= old × (1 + r), and ``effective_GBps`` new >= old / (1 + r)
        (the same bound expressed in bandwidth, since GB/s = bytes per step / p50).
    A null metric, here or in the baseline, fails its check.

    Args:
        doc: the results to gate (a :class:`Results` or its dict).
        engine: engine name; default "megakernel" when present and ok, else the ok engine with the
            lowest ``token_ms_p50``.
        allow_mismatch: compare against a baseline of another model, dtype, device or workload anyway.

    Returns:
        A :class:`GateReport`; its ``exit_code`` is 0 (all hold) or 1 (one fails).

    Raises:
        BubblescopeError: a document is invalid, the engine is unknown or not ok (here or in the
            baseline), a limit is negative or not finite, a fraction limit is above 1 (the message
            suggests the fraction when it looks like a percentage), ``baseline`` and ``max_regression`` are not
            given together, no check is requested at all, or the baseline is not comparable
            (:func:`baseline_mismatches`: another model, architecture, size, dtype, device (name) or workload)
            and ``allow_mismatch`` is False.
    """
    check_limits(min_bandwidth_util, max_bubble_ratio, max_token_p99_ms, max_regression, baseline)
    doc = _as_doc(doc, "results")
    if baseline is not None:
        baseline = _as_doc(baseline, "baseline")
        diff = baseline_mismatches(doc, baseline)
        if diff and not allow_mismatch:
            raise BubblescopeError(f"gate: the baseline is not comparable ({'; '.join(diff)}); "
                                   "pass --allow-mismatch to compare anyway")
    try:
        eng = _pick_engine(doc, engine)
    except BubblescopeError as e:
        if engine is None:
            raise
        raise BubblescopeError(f"--engine: {e}") from None  # the option named, as "--baseline:" below
    name = eng["name"]
    checks = []
    if min_bandwidth_util is not None:
        checks.append(_check("min_bandwidth_util", name, dig(eng, "bandwidth", "util_peak"), min_bandwidth_util,
                             lambda m, lim: m >= lim, "util_peak"))
    if max_bubble_ratio is not None:
        ratio, source = bubble_ratio(eng)  # the reports' one bubble ratio (ladder.bubble_ratio)
        checks.append(_check("max_bubble_ratio", name, ratio, max_bubble_ratio, lambda m, lim: m <= lim,
                             f"bubble_ratio ({source})" if source else "bubble_ratio"))
    if max_token_p99_ms is not None:
        checks.append(_check("max_token_p99_ms", name, dig(eng, "latency", "token_ms_p99"), max_token_p99_ms,
                             lambda m, lim: m <= lim, "token_ms_p99"))
    if baseline is not None:
        try:
            old = _pick_engine(baseline, name)
        except BubblescopeError as e:  # say which document lacks it: the run's was checked above
            raise BubblescopeError(f"--baseline: {e}") from None
        for metric, path in (("token_ms_p50", ("latency", "token_ms_p50")),
                             ("effective_GBps", ("bandwidth", "effective_GBps"))):
            before = dig(old, *path)
            if before is None:
                checks.append(Check(f"regression_{metric}", name, dig(eng, *path), None, False,
                                    f"baseline {metric} not measured (null): failing closed"))
                continue
            if metric == "token_ms_p50":
                limit, holds = before * (1 + max_regression), (lambda m, lim: m <= lim)
            else:
                limit, holds = before / (1 + max_regression), (lambda m, lim: m >= lim)
            c = _check(f"regression_{metric}", name, dig(eng, *path), limit, holds, metric)
            checks.append(replace(c, detail=f"{c.detail} (baseline {show(c.name, before)[0]}, allowed regression "
                                            f"{max_regression:.0%})"))
    return GateReport(name, tuple(checks))


def _note(c: Check) -> str:
    """What the table's last column says of a check: the rule it applies (the measured value and the limit have
    their own columns), with the baseline where there is one, or why it failed closed."""
    if c.measured is None or c.limit is None:
        return c.detail
    rule = "≤ limit" if c.name.startswith("max_") or c.name == "regression_token_ms_p50" else "≥ limit"
    extra = c.detail[c.detail.index("(") + 1:c.detail.rindex(")")] if "(" in c.detail else ""
    return f"{rule}; {extra}" if extra else rule


def render_gate(report: GateReport, console) -> None:
    """Print the checks as a rich table and a one-line verdict (PASS / FAIL) to a rich ``console``."""
    from rich.table import Table
    from rich.text import Text

    from .layout import Wrapped

    table = Table(title=Text(f"bubblescope gate — engine {report.engine}"), title_justify="left")
    # Names and numbers never wrap (a split number reads as two); only the detail sentence wraps, by word. Its
    # min_width is small enough that a regression row (25-character name) still fits 80 columns uncropped.
    for header in ("check", "measured", "limit", "result", "rule"):
        table.add_column(header, justify="right" if header in ("measured", "limit") else "left",
                         no_wrap=header != "rule", overflow="fold" if header == "rule" else "ellipsis",
                         min_width=12 if header == "rule" else None)
    for c in report.checks:
        table.add_row(c.name, *show(c.name, c.measured, c.limit),
                      Text("PASS", style="bold green") if c.passed else Text("FAIL", style="bold red"),
                      Wrapped(_note(c)))
    console.print(table)
    failed = sum(not c.passed for c in report.checks)
    if failed:
        console.print(Text.assemble(("gate FAILED", "bold red"),
                                    f": {failed} of {count(len(report.checks), 'check')} failed (exit 1)"))
    else:
        n = len(report.checks)
        console.print(Text.assemble(("gate PASSED", "bold green"),
                                    f": {n} of {count(n, 'check')} {plural(n, 'holds', 'hold')} (exit 0)"))
