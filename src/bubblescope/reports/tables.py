"""What the terminal and HTML reports both show, formatted once so the two always agree.

Pure functions of a results document returning strings; null (not measured) shows as an em dash.
"""

from __future__ import annotations

from .ladder import FIDELITY_TOLERANCE, IN_KERNEL, bubble_ratio, ladder, request_times
from .results import dig, ordered
from ..wording import count

MISSING = "—"

# (header, path inside an engine entry, format). Formats: ms 3 decimals, rates 1, GB/s whole,
# fractions as percentages, counts without a needless ".0". Headers break with "\n" in the terminal.
LATENCY_COLUMNS = (
    ("Engine", ("name",), "text"),
    ("TPOT\np50 ms", ("latency", "token_ms_p50"), "ms"),
    ("TPOT\np99 ms", ("latency", "token_ms_p99"), "ms"),
    ("tok/s", ("latency", "tok_per_s"), "rate"),
    ("GB/s", ("bandwidth", "effective_GBps"), "gbps"),
    ("%\npeak", ("bandwidth", "util_peak"), "pct"),
    ("%\ncopy", ("bandwidth", "util_copy"), "pct"),
)
TIMELINE_COLUMNS = (
    ("Engine", ("name",), "text"),
    ("kernels\n/step", ("timeline", "kernels_per_step"), "count"),
    ("launches\n/step", ("timeline", "launches_per_step"), "count"),
    ("bubble\nratio", lambda eng, doc: bubble_ratio(eng), "bubble"),
    ("launch\nshare", ("timeline", "launch_share"), "pct"),
    ("sync\nshare", ("timeline", "sync_share"), "pct"),
    ("token\nagreement", ("correctness", "token_agreement"), "pct"),
)
# The sync share (docs/design.md's sync_share, the same words in every report) is host time blocked in
# cudaStreamSynchronize & co.: high when the host waits on a busy GPU.
SYNC_NOTE = ("sync share: fraction of the step wall time the host spends blocked in a synchronize call; high "
             "when the GPU is busy and the host has nothing else to do, which costs nothing by itself")
# One bubble ratio everywhere (ladder.bubble_ratio); the marked values are a one-kernel step's in-kernel wait.
BUBBLE_MARK = "*"
BUBBLE_NOTE = ("bubble ratio: the share of the timed decode step the GPU idles (1 − GPU busy per profiled step / "
               "the TPOT p50: the profiler lengthens a host-bound step, not the GPU's work); marked "
               f"{BUBBLE_MARK}: a step of one kernel, whose bubble is its programs' wait on dependencies, from the "
               "megakernel's own clock (program-time waiting / program-time)")
# One request of the workload (ladder.request_times): time to the first token, the decode steps after it, and
# the whole request; "~" marks TTFT + (n − 1) × TPOT p50 in documents that did not record the measured time.
# Beside them the first generation in the process (latency.first_run), which a fresh process pays once; "—" in
# documents without it (a run without warm-up, documents written before it).
REQUEST_COLUMNS = (
    ("Engine", ("name",), "text"),
    ("TTFT\nms", ("latency", "ttft_ms"), "ms"),
    ("decode\nms", lambda eng, doc: request_times(eng, doc), "decode"),
    ("end to end\nms", lambda eng, doc: request_times(eng, doc), "e2e"),
    ("first run\nTPOT ms", ("latency", "first_run", "token_ms_p50"), "ms"),
    ("first run\nTTFT ms", ("latency", "first_run", "ttft_ms"), "ms"),
)
LATENCY_NOTE = ("TPOT: time per output token after the first (host wall time, token on the host), p50 and p99 over "
                "every decode step of the timed runs; tok/s: 1000 / the mean TPOT, which a slow tail pulls below "
                "1000 / p50; TTFT: time to the first token (prefill and its sampling); "
                "end to end: the measured generation time of one request (median over the timed runs), or ~ TTFT + "
                "(n − 1) × TPOT p50 where it was not recorded; decode: end to end − TTFT; first run: the first, "
                "untimed generation in this process (compiles, graph captures, allocator growth), its TPOT p50 and "
                "TTFT")


def latency_note(doc: dict) -> str:
    """:data:`LATENCY_NOTE`, and where an engine's prefill replayed CUDA graphs (``compile.prefill_graphs``: the
    megakernel's batched prefill on a GPU) how its TTFT differs in kind from the eager prefills beside it."""
    graphed = [e["name"] for e in doc.get("engines") or []
               if e.get("status") == "ok" and (e.get("compile") or {}).get("prefill_graphs")]
    if not graphed:
        return LATENCY_NOTE
    return (f"{LATENCY_NOTE}; the TTFT of {', '.join(graphed)}: a batched prefill replayed as a CUDA graph per "
            "64-position bucket of prompt length (captured in the untimed run), the other engines' prefill an "
            "eager batched forward, so part of the difference is the graph, not the decode kernel")


HEADLINE = (LATENCY_COLUMNS[:1] + (("Status", ("status",), "text"),) + LATENCY_COLUMNS[1:] + REQUEST_COLUMNS[1:]
            + TIMELINE_COLUMNS[1:])

def fmt(value, kind: str = "num") -> str:
    """Format one value for display: ``ms`` (3 decimals), ``rate`` (1), ``gbps`` (0; 2 significant
    digits below 10), ``pct``
    (a fraction as a percentage, 1 decimal), ``ratio`` (3), ``bubble`` (a ``(ratio, source)`` pair of
    :func:`~.ladder.bubble_ratio`: 3 decimals, marked when in-kernel), ``count`` (integer or 1 decimal),
    ``bytes`` (GB/MB/kB, decimal units), ``text``, ``num`` (6 significant digits). None gives "—"."""
    if value is None:
        return MISSING
    if kind == "text" or isinstance(value, str):
        return str(value)
    if kind == "ms":
        return f"{value:.3f}"
    if kind == "rate":
        return f"{value:.1f}"
    if kind == "gbps":  # a CPU run of a tiny model streams a few hundredths of a GB/s: not "0"
        return f"{value:.0f}" if abs(value) >= 10 or value == 0 else f"{value:.2g}"
    if kind == "pct":
        return f"{value * 100:.1f} %"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "sci":  # small positive quantities over decades (a KL divergence in nats)
        return f"{value:.3g}"
    if kind == "nll":
        return f"{value:.4f}"
    if kind == "yesno":
        return "yes" if value else "no"
    if kind == "delta_us":
        return f"{value:+,.1f}"
    if kind in ("e2e", "decode"):  # ladder.request_times: the measured time, or the estimate marked "~"
        ms = value["e2e_ms" if kind == "e2e" else "decode_ms"]
        return MISSING if ms is None else ("" if value["e2e_measured"] else "~") + fmt(ms, "rate")
    if kind == "bubble":  # (ratio, source) of ladder.bubble_ratio
        ratio, source = value
        return MISSING if ratio is None else f"{ratio:.3f}" + (BUBBLE_MARK if source == IN_KERNEL else "")
    if kind == "count":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    if kind == "bytes":
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if abs(value) >= size:
                return f"{value / size:.2f} {unit}"
        return f"{value:.0f} B"
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def headline_rows(doc: dict, columns=HEADLINE) -> list[list[str]]:
    """One row of formatted cells (``columns``, default :data:`HEADLINE`) per engine, in ladder order; a column's
    path is a key path into the engine entry, or a function of the entry and the document (the bubble ratio, the
    end-to-end time)."""
    return [[fmt(path(eng, doc) if callable(path) else dig(eng, *path), kind) for _, path, kind in columns]
            for eng in ordered(doc.get("engines") or [])]


def not_run(doc: dict) -> list[tuple[str, str, str]]:
    """``(engine, status, reason)`` for every skipped or failed engine."""
    return [(str(e.get("name")), str(e.get("status")), e.get("reason") or MISSING)
            for e in ordered(doc.get("engines") or []) if e.get("status") != "ok"]


def threads_text(threads: dict | None) -> str | None:
    """The CPU threads a run had (``device.threads``) in words: ``torch 2 threads, OMP_NUM_THREADS unset, 2
    cores``; None when not recorded."""
    if not threads:
        return None
    omp = threads.get("omp_num_threads")
    parts = [f"torch {_count(threads.get('torch_threads'), 'thread')}",
             f"OMP_NUM_THREADS={omp}" if omp is not None else "OMP_NUM_THREADS unset",
             f"{_count(threads.get('cpu_count'), 'core')}"]
    return ", ".join(parts)


def device_line(doc: dict) -> str:
    """Which device the numbers come from, said plainly, with its bandwidth ceilings (on a CPU, its threads)."""
    dev = doc.get("device") or {}
    if dev.get("type") != "cuda":
        threads = threads_text(dev.get("threads"))
        return (f"CPU only — GPU metrics unavailable ({dev.get('name') or 'unknown CPU'}"
                + (f"; {threads})" if threads else ")"))
    parts = [f"{dev.get('sm_count')} SMs" if dev.get("sm_count") is not None else None,
             f"L2 {fmt(dev.get('l2_bytes'), 'bytes')}" if dev.get("l2_bytes") is not None else None,
             f"NVML peak {fmt(dev.get('nvml_peak_GBps'), 'gbps')} GB/s",
             f"measured copy {fmt(dev.get('copy_GBps'), 'gbps')} GB/s"]
    return f"GPU: {dev.get('name')} — " + ", ".join(p for p in parts if p)


# model.weights, in words (absent or bf16: nothing to add)
WEIGHTS_SHOWN = {"fp8": "projections in FP8 e4m3 (--weights fp8)",
                 "fp8-all": "projections and LM head in FP8 e4m3 (--weights fp8-all)"}


def model_line(doc: dict) -> str:
    """Model name, source, parameter count, weight bytes, dtype and FP8 weights (``model.weights``)."""
    m = doc.get("model") or {}
    params = m.get("parameters")
    if params is None:
        shown = f"{MISSING} parameters"
    else:
        shown = f"{params / 1e9:.2f} B parameters" if params >= 1e9 else f"{params / 1e6:.3g} M parameters"
    return (f"{m.get('name')} ({m.get('source')}{', ' + m['path'] if m.get('path') else ''}) — {shown}, "
            f"weights {fmt(m.get('weight_bytes'), 'bytes')}, {m.get('dtype')}"
            + (f", {WEIGHTS_SHOWN[m['weights']]}" if m.get("weights") in WEIGHTS_SHOWN else ""))


def _count(n, noun: str) -> str:
    """:func:`count` of a document value, which may be missing (then "—" and the plural)."""
    return count(n, noun) if isinstance(n, (int, float)) and not isinstance(n, bool) else f"{fmt(n)} {noun}s"


def workload_line(doc: dict) -> str:
    """Prompt and generation lengths, runs, warmup, context sweep and seed."""
    w = doc.get("workload") or {}
    # An empty sweep is a choice (the CPU default, or --context-sweep none), not a missing value: no "[—]".
    contexts = w.get("context_sweep") or []
    sweep = f"context sweep [{', '.join(str(c) for c in contexts)}]" if contexts else "no context sweep"
    return (f"prompt {_count(w.get('prompt_len'), 'token')}, generate {_count(w.get('gen_len'), 'token')}, "
            f"{_count(w.get('runs'), 'run')} after {_count(w.get('warmup'), 'warm-up run')}, "
            f"{sweep}, seed {fmt(w.get('seed'))}")


def us(value) -> str:
    """µs with the unit that keeps 3-4 significant digits readable (µs, ms or s); from 10,000 s on (a corrupt
    ``dur`` such as 1e15) in powers of ten ("1.00e+09 s"), as wide as "9,999.99 s", so the tables keep their
    80-column layout."""
    if value is None:
        return MISSING
    if abs(value) >= 1e10:
        return f"{value / 1e6:.2e} s"
    for unit, size in (("s", 1e6), ("ms", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.1f} µs"



def evidence_value(key: str, value) -> str:
    """One evidence number rounded, with the unit its key names (``_ms`` ms, ``_us`` as :func:`us` (µs, ms or s), ``GBps`` GB/s, ratios, shares, utilisations and agreement as %, ``growth``/``over`` as a
    factor, context in tokens, counts whole)."""
    if value is None or isinstance(value, str):
        return fmt(value)
    k = key.lower()
    if is_metric_name(key):  # an Nsight Compute metric: percent as ncu reports it, not a fraction
        if "pct" in k:
            return f"{value:.1f} %"
        return fmt(value, "bytes") if "bytes" in k else fmt(value, "count")
    if k.endswith("_pct"):  # already a percentage (ncu's stall shares), not a fraction
        return f"{value:.1f} %"
    if "gbps" in k:
        return f"{value:,.0f} GB/s"
    if "_ms" in k or k.startswith("ms"):
        return f"{value:.3f} ms" if value < 100 else f"{value:,.1f} ms"
    if "_us" in k:  # as the trace tables show times: a whole trace's span is seconds, not 12,920,244.0 µs
        return us(value)
    if "growth" in k or "_over_" in k:
        return f"{value:.2f}x"
    if any(w in k for w in ("ratio", "share", "util", "agreement")):
        return f"{value * 100:.1f} %"
    if "context" in k:
        return count(value, "token", fmt=",.0f")
    if "bytes" in k:
        return fmt(value, "bytes")
    if "logit" in k or "err" in k:
        return f"{value:.3g}"
    return fmt(value, "count")


_UNIT_WORDS = {"us", "ms", "gbps"}  # key words that evidence_value turns into the value's unit


def is_metric_name(key: str) -> bool:
    """An Nsight Compute metric name (``dram__throughput.avg.pct_of_peak_sustained_elapsed``: a unit, two
    underscores, a counter): shown whole, as ncu's documentation spells it, never turned into words."""
    return "__" in key


def _evidence_name(key: str, value) -> str:
    """The evidence key as words, less the unit word that the value now carries (``busy_us`` → ``busy``); an ncu
    metric name (:func:`is_metric_name`) as it is."""
    if is_metric_name(key):
        return key
    if key.startswith("stall_") and key.endswith("_pct"):  # an ncu stall reason, named as ncu names it
        return f"stall {key[len('stall_'):-len('_pct')]}"
    if key.endswith("_pct") and value is not None and not isinstance(value, str):
        key = key[:-len("_pct")]  # the value carries its "%"
    words = key.split("_")
    if value is not None and not isinstance(value, str):
        words = [w for w in words if w.lower() not in _UNIT_WORDS] or words
    return " ".join(words)


def evidence_text(evidence: dict) -> str:
    """``name value unit`` pairs of a finding's evidence (``bubble ratio 62.0 %, kernels per step 412, busy
    1,204.0 µs``): the key's unit word moves onto the value."""
    return ", ".join(f"{_evidence_name(k, v)} {evidence_value(k, v)}" for k, v in (evidence or {}).items())


def kernel_tiling(c: dict) -> str:
    """One line naming a megakernel's implementation and the tile shapes chosen for the model (from
    ``compile.gluon`` / ``compile.tiling`` of results.json), e.g. ``gluon: BR 32 · ring 12 · split_k 2 ·
    block_s 64 · splits 16`` (with ``slot_boxes`` and the matvec, ``matvec mma`` or ``matvec bits``, where the
    document has them: newer documents choose them per model too); "—" for engines without them."""
    g, t = c.get("gluon") or {}, c.get("tiling") or {}
    if g:
        parts = [f"{k} {g[k]}" for k in ("BR", "BK", "ring", "slot_boxes", "split_k", "rows_od", "block_s",
                                         "min_chunk", "splits") if g.get(k) is not None]
        if g.get("mv_widen"):
            parts.append(f"matvec {g['mv_widen']}")
        if g.get("qk_norm_in_attn"):
            parts.append("q/k-norm in attention")
        return f"{c.get('implementation') or 'gluon'}: " + " · ".join(parts)
    if t:
        rows = "/".join(str(t.get(k, "?")) for k in ("rows_qkv", "rows_o", "rows_gateup", "rows_down", "rows_lm"))
        return f"{c.get('implementation') or 'triton'}: rows qkv/o/gateup/down/lm {rows} · splits {t.get('kv_splits')}"
    return "—"


def stream_feed_line(ik: dict | None) -> str | None:
    """The weight stream's feed of a megakernel (``intrakernel.stream_feed``, medians over layers) in words, e.g.
    ``1.70 TB/s over the attention chain (13.0 µs per layer), 4.16 TB/s over the MLP (24.0 µs)``; None where the
    document has none (the Triton kernel, CPU runs, documents before it existed)."""
    med = dig(ik or {}, "stream_feed", "median")
    if not isinstance(med, dict):
        return None

    def tbps(v) -> str:  # GB/s in the document; TB/s reads better at HBM rates
        return MISSING if v is None else f"{v / 1e3:.2f}"

    return (f"{tbps(med.get('chain_GBps'))} TB/s over the attention chain ({fmt(med.get('chain_us'), 'rate')} µs per "
            f"layer), {tbps(med.get('mlp_GBps'))} TB/s over the MLP ({fmt(med.get('mlp_us'), 'rate')} µs)")


# The ablation ladder (ladder.ladder rows): (header, row key, format). The step is µs saved per token against the
# rung below that ran (negative: this rung is slower).
LADDER_COLUMNS = (
    ("Engine", "engine", "text"),
    ("ms/tok\np50", "token_ms_p50", "ms"),
    ("%\npeak", "util_peak", "pct"),
    ("kernels\n/step", "kernels_per_step", "count"),
    ("bubble\nratio", ("bubble_ratio", "bubble_source"), "bubble"),
    ("saves\nµs/tok", "step_us", "delta_us"),
)
# What each rung removes and what it costs in accuracy (the terminal's second ladder table; the HTML's one table
# has both).
FIDELITY_COLUMNS = (
    ("Engine", "engine", "text"),
    ("removes (vs the rung below)", "removes", "text"),
    ("KL vs fp32\nnats", "kl_vs_fp32", "sci"),
    ("NLL\nnats/tok", "nll", "nll"),
    ("matched", "fidelity_matched", "yesno"),
)
LADDER_NOTE = ("Each rung removes one mechanism from the rung below it: saves = the rung below's p50 minus this "
               "one's, in µs per token (negative: this rung is slower)")


def ladder_rows(doc: dict, columns=LADDER_COLUMNS) -> list[tuple[dict, list[str]]]:
    """``(ladder row, formatted cells)`` per rung of :func:`~.ladder.ladder`, eager first."""
    out = []
    for row in ladder(doc):
        cells = [fmt(tuple(row[k] for k in key) if isinstance(key, tuple) else row[key], kind)
                 for _, key, kind in columns]
        out.append((row, cells))
    return out


def ladder_note(doc: dict) -> str:
    """:data:`LADDER_NOTE`, and on a CPU run which rungs (the megakernel's, the fused Triton engines') time the
    Triton interpreter."""
    if dig(doc, "device", "type") == "cuda":
        return LADDER_NOTE
    ran = [r["engine"] for r in ladder(doc) if r["token_ms_p50"] is not None]
    kinds = [what for what, prefix in (("megakernel", "megakernel"), ("fused", "reference-fused"))
             if any(e.startswith(prefix) for e in ran)]
    if not kinds:
        return LADDER_NOTE
    return LADDER_NOTE + f"; on this CPU run the {' and '.join(kinds)} rungs time the Triton interpreter, not the kernel"


def rungs_not_run(rows: list[tuple[dict, list[str]]]) -> list[str]:
    """``"engine — why"`` for each rung of :func:`ladder_rows` that did not run: its status (skipped, failed) and
    reason, or why it is not in the document."""
    return [f"{r['engine']} — " + (r["reason"] or MISSING if r["status"] == "not run"
                                   else f"{r['status']}: {r['reason'] or MISSING}")
            for r, _ in rows if r["status"] != "ok"]


def fidelity_note(doc: dict) -> str | None:
    """The bar the fidelity columns are read against: the run-dtype reference's own KL and NLL (from any engine's
    ``correctness``) and the tolerance of "matched"; None when no engine has them."""
    c = next((e["correctness"] for e in doc.get("engines") or [] if e.get("status") == "ok"
              and (e.get("correctness") or {}).get("ref_nll") is not None), None)
    if c is None:
        return None
    t = FIDELITY_TOLERANCE
    dtype = dig(doc, "model", "dtype") or "run-dtype"
    return (f"fidelity: on the same teacher-forced tokens, each engine against the reference engine run in float32; "
            f"the {dtype} reference's own KL {fmt(c.get('ref_kl_vs_fp32'), 'sci')} nats and NLL "
            f"{fmt(c.get('ref_nll'), 'nll')} nats/token (fp32 NLL {fmt(c.get('nll_fp32'), 'nll')}); matched = KL at "
            f"most {t['kl_rel']:g}× the reference's + {t['kl_abs']:g} nats and NLL at most the reference's + "
            f"{t['nll_abs']:g} nats/token")


def steps_note(doc: dict) -> str | None:
    """How many profiled decode steps the per-step figures are medians of, and how many warm-up steps were left
    out of every figure (``timeline.steps``, ``timeline.warmup_steps``); None when no engine has a GPU timeline."""
    tl = [e["timeline"] for e in doc.get("engines") or [] if e.get("status") == "ok" and e.get("timeline")
          and e["timeline"].get("available") and e["timeline"].get("steps")]
    if not tl:
        return None
    steps, dropped = max(t["steps"] for t in tl), max((t.get("warmup_steps") or 0) for t in tl)
    if "warmup_steps" not in tl[0]:
        return f"per-step figures: medians over {count(steps, 'profiled decode step')}"
    return (f"per-step figures: medians over {count(steps, 'profiled decode step')}; "
            f"{count(dropped, 'warm-up step')} left out of every figure")


def request_title(doc: dict) -> str:
    """The title of the request table: the workload's prompt and new tokens."""
    w = doc.get("workload") or {}
    return (f"One request: prompt {_count(w.get('prompt_len'), 'token')}, {_count(w.get('gen_len'), 'new token')} "
            "(ms; ~ = TTFT + (n − 1) × TPOT p50, not recorded)")


def counters_workload_line(doc: dict) -> str | None:
    """The workload the hardware counters were read on (``counters.workload``), against the tables' own; None
    when the document has no counters or no record of their workload."""
    cw = (doc.get("counters") or {}).get("workload")
    if not cw:
        return None
    w = doc.get("workload") or {}
    return (f"counters read on `bubblescope generate` with a {fmt(cw.get('prompt_len'), 'count')}-token prompt, one "
            f"decode step's launches after {_count(cw.get('skipped_steps'), 'step')}: not the workload of the tables "
            f"above (prompt {_count(w.get('prompt_len'), 'token')}, {_count(w.get('gen_len'), 'new token')})")



def gbps_text(gbps: float) -> str:
    """GB/s in a sentence: whole numbers with thousands separators from 10 up ("2,715"), below as the tables
    print them (:func:`fmt`'s ``gbps``: "0.3", so a tiny model's rate is not "0")."""
    return f"{gbps:,.0f}" if abs(gbps) >= 10 else fmt(gbps, "gbps")
