"""One decode step's dependency chain, layer by layer, from a Gluon timeline frame (``gluon_check.py``'s
``*_frame.csv.gz``, written beside its JSON): where each layer's time goes between the previous layer's last
down-proj task and its own.

Per layer (µs): ``qkv_span`` (the previous DOWN stage's last end → the QKV stage's last end) with the QKV tasks'
median ``qkv_stage`` / ``qkv_mv`` / ``qkv_epi`` phases; ``attn_span`` (→ the attention stage's last end) with the
critical attention task's phases (``timeline.attn_critical``'s per-layer parts); ``o_span``, ``g_span``,
``d_span`` (→ the O-proj, gate-up and down stages' last ends), with ``g_stage``, the median over CTAs of the
staging of each one's first gate-up task (the one that loads and normalises the vector). The spans' sum is the
layer's time. For the two normalised inputs also: ``qkv_ready`` / ``g_ready`` (median task ready time after the
upstream DOWN / O-proj stage's last end: the hop) and ``d_tail`` / ``o_tail`` (that upstream stage's last end less
its tasks' 10th-percentile end: how spread its ends are).

With ``--model`` (the preset the frame ran, default Gluon tiling, 16-bit weights), also the weight stream's feed
(``timeline.stream_feed``, which ``bubblescope diagnose`` reports as ``intrakernel.stream_feed``): the bytes of tiles
the producers issue per µs over all SMs (each task's bytes spread evenly between its first and last TMA issue; a
ring slot is reissued only once its consumer frees it), per layer over the stretch from the previous DOWN stage's
end to the O-proj stage's end and over the rest of the layer (TB/s; the product's ``chain`` / ``mlp`` in GB/s), and
how long the QKV matvec ends after its task's last tile was issued (µs).

With ``--goal-ms`` (and ``--model``), what a per-token goal leaves each layer against the chain's links
(:func:`goal_budget`).

    python benchmarks/chain_breakdown.py FRAME.csv.gz [--model llama-3.2-1b [--params '{"max_rows": 16}']
        [--goal-ms 0.64]] [--out chain.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bubblescope.errors import BubblescopeError
from bubblescope.megakernel_engine.timeline import attn_critical, edge_summary, stage_edges, task_phases
from bubblescope.megakernel_engine.timeline import stream_feed as timeline_stream_feed

STAGES = ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")
SPANS = ("qkv_span", "attn_span", "o_span", "g_span", "d_span")  # a layer's time is their sum


def layer_chain(df: pd.DataFrame) -> pd.DataFrame:
    """Per layer, each stage's span from the upstream stage's last end (µs) and the QKV tasks' median phases."""
    ends = df.groupby(["layer", "name"])["end_us"].max().unstack()
    rows = []
    prev = None
    for layer in sorted(df["layer"].unique()):
        e = ends.loc[layer]
        q = df[(df["layer"] == layer) & (df["name"] == "QKV")]
        row = {"layer": int(layer), "qkv_span": (e["QKV"] - prev) if prev is not None else float("nan"),
               "qkv_stage": float((q["staged_us"] - q["ready_us"]).median()),
               "qkv_mv": float((q["mv_end_us"] - q["staged_us"]).median()),
               "qkv_epi": float((q["end_us"] - q["mv_end_us"]).median())}
        g = df[(df["layer"] == layer) & (df["name"] == "GATEUP")]
        if "program" in g:  # a CTA stages the vector at its first gate-up task of the layer only
            g = g.sort_values("ready_us").groupby("program").head(1)
            row["g_stage"] = float((g["staged_us"] - g["ready_us"]).median())
        o = df[(df["layer"] == layer) & (df["name"] == "OPROJ")]["end_us"]
        row["o_tail"] = float(o.max() - o.quantile(0.1))
        row["g_ready"] = float((g["ready_us"] - o.max()).median())
        if prev is not None:
            d = df[(df["layer"] == prev_layer) & (df["name"] == "DOWN")]["end_us"]
            row["d_tail"] = float(d.max() - d.quantile(0.1))
            row["qkv_ready"] = float((q["ready_us"] - prev).median())
        for a, b, name in (("QKV", "ATTN", "attn_span"), ("ATTN", "OPROJ", "o_span"), ("OPROJ", "GATEUP", "g_span"),
                           ("GATEUP", "DOWN", "d_span")):
            row[name] = e[b] - e[a]
        rows.append(row)
        prev, prev_layer = e["DOWN"], layer
    return pd.DataFrame(rows)


def task_bytes(model: str, params: dict | None = None) -> dict[str, int]:
    """Weight bytes of one task per opcode for ``model``'s Gluon tiling under ``params`` (MegakernelParams fields;
    default: this checkout's defaults, which must be the frame's: older frames of Qwen2.5-0.5B ran 16-row tiles)
    and 16-bit weights (``schedule.task_weight_bytes``'s rule)."""
    from bubblescope.megakernel_engine.gluon.host import gluon_tiling
    from bubblescope.megakernel_engine.schedule import MegakernelParams, task_weight_bytes
    from bubblescope.models.config import get_preset
    cfg = get_preset(model)
    return task_weight_bytes(cfg, gluon_tiling(cfg, MegakernelParams(**(params or {})), 132), 2)


def slot_bytes(model: str, params: dict | None = None) -> int:
    """Bytes of one weight-ring slot of ``model``'s Gluon kernel under ``params`` (16-bit weights): ``slot_boxes``
    boxes of ``BR`` × ``BK`` (``gluon.host.ring_slot_bytes``)."""
    import torch

    from bubblescope.megakernel_engine.gluon.host import gluon_constexprs, gluon_params, gluon_tiling, ring_slot_bytes
    from bubblescope.megakernel_engine.schedule import MegakernelParams
    from bubblescope.models.config import get_preset
    cfg = get_preset(model)
    p = gluon_params(cfg, MegakernelParams(**(params or {})))
    cx = gluon_constexprs(cfg, gluon_tiling(cfg, p, 132), p, 4096, torch.bfloat16, cfg.attention_bias)
    return ring_slot_bytes(cx, 2)


def goal_budget(df: pd.DataFrame, model: str, goal_ms: float, copy_tbps: float) -> dict:
    """What a per-token goal of ``goal_ms`` leaves each layer of ``model`` (µs), against the frame's chain links.

    ``lm_head_us``: the LM head's ``vocab_size × hidden_size`` 16-bit weights at the device copy's ``copy_tbps``
    (TB/s = bytes per µs / 1e6; a stream-bound stage at best); ``budget_layer_us`` = (goal − lm_head) / layers.
    ``link_floor_us``: per weight stage (QKV, O-proj, gate-up, down) the median hop (``stage_edges``) plus its tasks'
    median staging, matvec and epilogue (``task_phases``), plus the attention's block math alone (``attn_critical``'s
    ``blocks_us``, as if its q, ticket and combine cost nothing): the layer's chain if every stage ran one task on
    weights already in shared memory at today's link times. ``with_attention_us`` puts the measured attention
    chain back (``attn_critical``'s ``total_us``).
    """
    from bubblescope.models.config import get_preset
    cfg = get_preset(model)
    lm_head_us = cfg.vocab_size * cfg.hidden_size * 2 / (copy_tbps * 1e6)
    layers = cfg.num_hidden_layers
    hops = stage_edges(df).groupby("opcode")["hop_us"].median()
    phases = {p["opcode"]: p for p in task_phases(df) or []}
    attn = attn_critical(df) or {}
    weight_stages = ("QKV", "OPROJ", "GATEUP", "DOWN")
    links = {op: float(hops.get(op, float("nan")) + phases[op]["stage_us_p50"] + phases[op]["mv_us_p50"]
                       + phases[op]["epilogue_us_p50"]) for op in weight_stages if op in phases}
    blocks, attn_total = attn.get("blocks_us", float("nan")), attn.get("total_us", float("nan"))
    floor = sum(links.values()) + blocks
    return {"goal_ms": goal_ms, "copy_tbps": copy_tbps, "lm_head_us": round(lm_head_us, 2), "layers": layers,
            "budget_layer_us": round((goal_ms * 1e3 - lm_head_us) / layers, 3),
            "stage_links_us": {k: round(v, 3) for k, v in links.items()}, "link_floor_us": round(floor, 3),
            "with_attention_us": round(floor - blocks + attn_total, 3)}


# The product's stream_feed columns under the names this script's recorded JSON files use (rates there in TB/s).
_LEGACY = {"chain_us": "stretch_us", "chain_GBps": "stretch_tbps", "mlp_us": "rest_us", "mlp_GBps": "rest_tbps",
           "layer_GBps": "layer_tbps"}


def stream_feed(df: pd.DataFrame, nbytes: dict[str, int], slot: int = 16384) -> pd.DataFrame:
    """``timeline.stream_feed`` per layer under this script's names: the producers' tile-issue rate (TB/s) over the
    stretch (previous DOWN end → O-proj end) and over the rest (O-proj end → DOWN end), and the QKV tasks' median
    ``mv_end − last TMA issue`` (µs)."""
    feed = timeline_stream_feed(df, nbytes, slot)
    for col in ("chain_GBps", "mlp_GBps", "layer_GBps"):
        feed[col] = feed[col] / 1e3
    return feed.rename(columns=_LEGACY)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frame", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--model", help="the preset the frame ran: adds the weight stream's feed (stream_feed)")
    ap.add_argument("--params", default="{}", help="the MegakernelParams the frame ran, as JSON (for its tiles)")
    ap.add_argument("--goal-ms", type=float, help="with --model: what this per-token goal leaves each layer")
    ap.add_argument("--copy-tbps", type=float, default=4.24, help="the device copy's rate (TB/s; default: the "
                    "H200's measured 4,242 GB/s in NOTES.md, rounded)")
    a = ap.parse_args()
    if not a.frame.is_file():
        print(f"chain_breakdown: {a.frame}: no such file", file=sys.stderr)
        return 2
    df = pd.read_csv(a.frame)
    chain = layer_chain(df)
    med = chain.drop(columns=["layer"]).median().round(3).to_dict()
    doc = {"frame": a.frame.name, "layers": int(len(chain)), "median_us": med,
           "layer_us_p50": round(float(chain[list(SPANS)].sum(axis=1, min_count=5).median()), 3),
           "attn_critical": attn_critical(df), "task_phases": task_phases(df), "edges": edge_summary(stage_edges(df)),
           "per_layer": chain.round(3).to_dict(orient="records")}
    if a.model:
        try:
            params = json.loads(a.params)
            nbytes, slot = task_bytes(a.model, params), slot_bytes(a.model, params)
        except (ValueError, TypeError, BubblescopeError) as e:
            print(f"chain_breakdown: --params / --model: {e}", file=sys.stderr)
            return 2
        feed = stream_feed(df, nbytes, slot)
        doc["stream_feed"] = {"model": a.model, "median": feed.drop(columns=["layer"]).median().round(3).to_dict(),
                              "per_layer": feed.round(3).to_dict(orient="records")}
        print(feed.round(2).to_string(index=False))
        if a.goal_ms:
            doc["goal"] = goal_budget(df, a.model, a.goal_ms, a.copy_tbps)
            print(json.dumps(doc["goal"]))
    print(chain.round(2).to_string(index=False))
    print(json.dumps({k: doc[k] for k in ("median_us", "layer_us_p50", "attn_critical")}, indent=1))
    if a.out:
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
