"""What the terminal and HTML views of ``diagnose trace`` both show, formatted once so the two always agree.

Pure functions of a ``bubblescope.trace/1`` summary (:mod:`bubblescope.profiler.trace.summary`, its ``ranks``
section from :mod:`bubblescope.profiler.trace.ranksummary`) returning strings; times come in µs and are shown in the
unit that keeps them readable; None (not measured) shows as an em dash.
"""

from __future__ import annotations

from .tables import MISSING, fmt, gbps_text, us
from ..wording import count

IDLE_PARTS = ("host_wait", "kernel_wait", "other")
# Headers break with "\n" in the terminal; the HTML view joins them with a space.
DEVICE_HEADERS = ("GPU", "kernels", "memcpy", "memset", "streams", "busy", "span", "bubble\nratio")
IDLE_HEADERS = ("device", "host-wait", "kernel-wait", "other")
STEP_ROW_HEADERS = ("step", "warm-up", "wall", "GPU busy", "GPU span", "GPU idle", "bubble\nratio", "kernels",
                    "launches")
# The multi-rank tables: four narrow ones, so that each fits an 80-column terminal.
RANK_WINDOW_HEADERS = ("rank", "GPU", "kernels", "busy", "span", "bubble\nratio", "NCCL\nshare")
RANK_MEDIAN_HEADERS = ("rank", "compute\nper step", "NCCL\nper step", "slowest\nin")
RANK_TIMING_HEADERS = ("step", "start\nskew", "end\nskew", "span", "first\nstart", "last\nstart", "last\nend")
RANK_WORK_HEADERS = ("step", "slowest\nrank", "compute\nskew", "NCCL share\nmin–max")
HOST_OP_HEADERS = ("operator", "calls\n/step", "per step", "share")
TIE = "tie"  # a per-step rank cell where two or more ranks tie (null in the JSON)


def idle_title(devices: list[dict]) -> str:
    """The idle table's title, naming the kernel-wait threshold (µs) the summary used."""
    threshold = (devices[0].get("idle") or {}).get("threshold_us") if devices else None
    return f"Idle time per device (kernel-wait: gaps < {fmt(threshold)} µs)"


def device_rows(devices: list[dict]) -> list[list[str]]:
    """One row of :data:`DEVICE_HEADERS` per device of a file summary (whole trace)."""
    return [[str(d["device"]), *(fmt(d.get(k), "count") for k in ("kernels", "memcpys", "memsets", "streams")),
             us(d.get("busy_us")), us(d.get("span_us")), fmt(d.get("bubble_ratio"), "ratio")] for d in devices]


def idle_rows(devices: list[dict]) -> list[list[str]]:
    """One row of :data:`IDLE_HEADERS` per device: each idle part's time and its share of the idle time."""
    rows = []
    for d in devices:
        split = d.get("idle") or {}
        rows.append([str(d["device"]), *(f"{us(split.get(k + '_us'))} ({fmt(split.get(k + '_share'), 'pct')})"
                                         for k in IDLE_PARTS)])
    return rows


def step_metric_rows(steps: dict) -> list[tuple[str, str]]:
    """``(label, value)`` rows of a file's decode-step figures (``timeline_summary``: medians over the measured
    steps, idle parts as means per step)."""
    idle = steps.get("idle") or {}
    delay = steps.get("launch_delay_us") or {}
    return [
        ("measured steps", fmt(steps.get("steps"), "count")),
        ("device", fmt(steps.get("device"))),
        ("step wall time (median)", us(steps.get("step_wall_us"))),
        ("GPU busy per step (median)", us(steps.get("gpu_busy_us_per_step"))),
        ("kernels per step", fmt(steps.get("kernels_per_step"), "count")),
        ("launches per step", fmt(steps.get("launches_per_step"), "count")),
        ("launches per s", fmt(steps.get("launches_per_s"), "rate")),
        ("bubble ratio (decode window)", fmt(steps.get("bubble_ratio"), "ratio")),
        ("launch share", fmt(steps.get("launch_share"), "pct")),
        ("sync share", fmt(steps.get("sync_share"), "pct")),
        (
            f"idle per step (mean): host-wait / kernel-wait (<{fmt(idle.get('threshold_us'))} µs) / other",
            " / ".join(us(idle.get(k)) for k in ("host_wait_us", "kernel_wait_us", "other_us")),
        ),
        ("launch delay p50 / p90 / max", " / ".join(us(delay.get(k)) for k in ("p50", "p90", "max"))),
        ("max registers per thread", fmt(steps.get("max_registers_per_thread"), "count")),
    ]


def breakdown_rows(rows: list[dict], with_name: bool) -> list[list[str]]:
    """``[name (with_name only), category, count, total, share]`` per kernel or category row."""
    return [[*([str(r["name"])] if with_name else []), str(r["category"]), fmt(r.get("count"), "count"),
             us(r.get("total_us")), fmt(r.get("share"), "pct")] for r in rows]


def host_ops_title(host_ops: dict) -> str:
    """The host-operator table's title, naming the thread the operators are of (``pid/tid``)."""
    thread = host_ops.get("thread") or {}
    where = f", thread {thread.get('pid')}/{thread.get('tid')}" if thread else ""
    return f"Host time per decode step (top-level CPU operators{where})"


def host_ops_note(host_ops: dict) -> str:
    """What the host-operator table's numbers are: means over the steps, shares of the mean step."""
    return (f"Means over {count(host_ops.get('steps'), 'measured step')}; share: of the mean step wall time, "
            f"{us(host_ops.get('mean_step_wall_us'))}. An operator counts in the step it starts in; outside "
            "operators: the loop's own Python, or the host waiting in a call that is not an operator.")


def host_op_rows(host_ops: dict) -> list[list[str]]:
    """One row of :data:`HOST_OP_HEADERS` per row of a file's ``host_ops`` (none when it has no rows)."""
    return [[str(r.get("name")), fmt(r.get("calls_per_step"), "count"), us(r.get("host_us_per_step")),
             fmt(r.get("share"), "pct")] for r in host_ops.get("rows") or []]


def step_table_rows(rows: list[dict]) -> list[list[str]]:
    """One row of :data:`STEP_ROW_HEADERS` per entry of a file's ``step_rows`` (GPU idle = span − busy)."""
    out = []
    for r in rows:
        busy, span = r.get("busy_us"), r.get("span_us")
        idle = span - busy if busy is not None and span is not None else None
        out.append([str(r.get("step")), "yes" if r.get("warmup") else "", us(r.get("wall_us")), us(busy), us(span),
                    us(idle), fmt(r.get("bubble_ratio"), "ratio"), fmt(r.get("kernels"), "count"),
                    fmt(r.get("launches"), "count")])
    return out


def ranks_title(section: dict) -> str:
    """``"2 ranks, marker 'm', 3 steps compared"``."""
    return (f"{section['world_size']} ranks, marker {section['step_marker']!r}, "
            f"{count(section['steps'], 'step')} compared")


def rank_window_rows(section: dict) -> list[list[str]]:
    """One row of :data:`RANK_WINDOW_HEADERS` per rank: its decode window."""
    return [[str(r["rank"]), fmt(r.get("device"), "count"), fmt(r.get("kernels"), "count"), us(r.get("busy_us")),
             us(r.get("span_us")), fmt(r.get("bubble_ratio"), "ratio"), fmt(r.get("nccl_share"), "pct")]
            for r in section["per_rank"]]


def rank_median_rows(section: dict) -> list[list[str]]:
    """One row of :data:`RANK_MEDIAN_HEADERS` per rank: its medians per step and the steps it was the slowest."""
    return [[str(r["rank"]), us(r.get("compute_us_per_step")), us(r.get("nccl_us_per_step")),
             count(r.get("slowest_steps", 0), "step")] for r in section["per_rank"]]


def rank_median_lines(section: dict) -> list[str]:
    """The median cross-rank skews, then the median NCCL share of a rank's step."""
    m = section.get("median") or {}
    return [f"median skew over steps: start {us(m.get('start_skew_us'))}, end {us(m.get('end_skew_us'))}, "
            f"compute {us(m.get('compute_skew_us'))}",
            f"median NCCL share of a rank's step: {fmt(m.get('nccl_share'), 'pct')}"]


def rank_cell(step: dict, key: str) -> str:
    """A per-step rank: the rank, or :data:`TIE` where ranks tie for it (``None`` in ``cross_rank_steps``)."""
    value = step.get(key)
    return TIE if value is None else fmt(value, "count")


def rank_timing_rows(section: dict, limit: int | None = None) -> list[list[str]]:
    """One row of :data:`RANK_TIMING_HEADERS` per step across ranks (the first ``limit`` when given)."""
    return [[str(s["step"]), us(s.get("start_skew_us")), us(s.get("end_skew_us")), us(s.get("span_us")),
             rank_cell(s, "first_start_rank"), rank_cell(s, "last_start_rank"), rank_cell(s, "last_end_rank")]
            for s in section["per_step"][:limit]]


def rank_work_rows(section: dict, limit: int | None = None) -> list[list[str]]:
    """One row of :data:`RANK_WORK_HEADERS` per step across ranks (the first ``limit`` when given)."""
    return [[str(s["step"]), rank_cell(s, "slowest_rank"), us(s.get("compute_skew_us")),
             f"{fmt(s.get('nccl_share_min'), 'pct')}–{fmt(s.get('nccl_share_max'), 'pct')}"]
            for s in section["per_step"][:limit]]


def steps_title(f: dict) -> str:
    """The decode-step table's title: the marker, or how the steps were found without one."""
    detection = f.get("step_detection") or {}
    if f.get("step_marker"):
        return f"Decode steps (marker {f['step_marker']!r})"
    method = detection.get("method")
    return f"Decode steps (no marker: found from {METHOD_WORDS.get(method, method)})"


METHOD_WORDS = {"cuda-graph": "CUDA-graph launches", "megakernel": "one kernel per step",
                "sequence": "a repeating kernel sequence", "cpu-ops": "a repeating CPU-op sequence"}


def graph_rows(graphs: dict) -> list[tuple[str, str]]:
    """``(label, value)`` rows of a file's CUDA-graph replays (:func:`~bubblescope.profiler.trace.graphs.graph_summary`)."""
    share = graphs.get("gap_inside_share")
    return [
        ("replays (distinct graphs)", f"{fmt(graphs.get('replays'), 'count')} ({fmt(graphs.get('graphs'), 'count')})"),
        ("kernels per replay (median)", fmt(graphs.get("kernels_per_replay"), "count")),
        ("share of the device's kernels in replays", fmt(graphs.get("kernel_share"), "pct")),
        ("GPU busy / span per replay (median)",
         f"{us(graphs.get('busy_us_per_replay'))} / {us(graphs.get('span_us_per_replay'))}"),
        ("gaps inside a replay (median; share of span)",
         f"{us(graphs.get('gap_inside_us_per_replay'))} ({fmt(share, 'pct')})"),
        ("gap between replays p50 / max", f"{us(graphs.get('gap_between_us_p50'))} / "
                                          f"{us(graphs.get('gap_between_us_max'))}"),
    ]


def _bytes_label(bw: dict) -> str:
    rows = bw.get("rows") or []
    contexts = [r["context"] for r in rows if r.get("context") is not None]
    if bw.get("kv") == "weights+kv" and contexts:
        where = "the trace's record" if bw.get("context_source") == "trace" else "--context"
        return f"weights + KV cache at context {min(contexts)}–{max(contexts)} (from {where})"
    if bw.get("kv") == "weights":
        return "weights only: the context is unknown (give --context)"
    return "as given (--bytes-per-step)"


def bandwidth_rows(bw: dict) -> list[tuple[str, str]]:
    """``(label, value)`` rows of a file's bandwidth section (``tracediagnose.bandwidth_section``): what a step
    moves, the peak and its source, and the median step against the floor."""
    s = bw.get("summary") or {}
    model = f"{bw['model']} in {bw['dtype']}" if bw.get("model") else "—"
    if bw.get("model") and bw.get("weights") not in (None, "bf16"):  # an FP8 checkpoint: its projections in FP8
        model += f", {'projections and LM head' if bw['weights'] == 'fp8-all' else 'projections'} in FP8"
    if bw.get("model") and bw.get("dtype_source") in ("trace", "default"):  # said, since it sets the bytes
        model += (" (as the trace records its run)" if "trace" in (bw.get("dtype_source"), bw.get("weights_source"))
                  else " (the default: --dtype for another)")
    peak = (f"{bw['peak_GBps']:,.0f} GB/s, {bw.get('peak_source')}" if bw.get("peak_GBps") is not None
            else f"unknown ({bw.get('peak_reason')})")
    nbytes = s.get("bytes_per_step")
    above, times = s.get("over_floor_us"), s.get("over_floor_x")
    return [
        ("model", model),
        ("bytes per step (median)", fmt(nbytes, "bytes")),
        ("bytes counted", _bytes_label(bw)),
        ("peak bandwidth", peak),
        ("step time (median of measured steps)", us(s.get("step_us_p50"))),
        ("effective bandwidth", f"{gbps_text(s['effective_GBps'])} GB/s" if s.get("effective_GBps") is not None
         else MISSING),
        ("% of peak (best step)", f"{fmt(s.get('util_peak'), 'pct')} ({fmt(s.get('best_util_peak'), 'pct')})"),
        ("floor: bytes ÷ peak", us(s.get("floor_us"))),
        ("above the floor", f"{us(above)} ({times:.2f}×)" if above is not None and times is not None else MISSING),
    ] + ([  # a profiled program's window: the same bytes over its steps timed without the profiler
        ("step time without the profiler", us(s["step_us_p50_unprofiled"])),
        ("effective bandwidth without it", f"{s['effective_GBps_unprofiled']:,.1f} GB/s"
         + (f", {fmt(s.get('util_peak_unprofiled'), 'pct')} of peak, {s['over_floor_x_unprofiled']:.2f}× the floor"
            if s.get("util_peak_unprofiled") is not None else "")),
    ] if s.get("step_us_p50_unprofiled") is not None and s.get("effective_GBps_unprofiled") is not None else [])


BANDWIDTH_STEP_HEADERS = ("step", "warm-up", "context", "bytes", "wall", "GB/s", "% of\npeak", "floor",
                          "above\nfloor")


def bandwidth_step_rows(bw: dict, limit: int | None = None) -> list[list[str]]:
    """One row of :data:`BANDWIDTH_STEP_HEADERS` per step of a bandwidth section (the first ``limit``)."""
    return [[str(r.get("step")), "yes" if r.get("warmup") else "", fmt(r.get("context"), "count"),
             f"{r['bytes'] / 1e9:,.4f} GB", us(r.get("wall_us")),
             f"{r['effective_GBps']:,.1f}" if r.get("effective_GBps") is not None else MISSING,
             fmt(r.get("util_peak"), "pct"), us(r.get("floor_us")), us(r.get("over_floor_us"))]
            for r in (bw.get("rows") or [])[:limit]]
