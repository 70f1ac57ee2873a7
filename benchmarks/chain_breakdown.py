"""One decode step's dependency chain, layer by layer, from a Gluon timeline frame (``gluon_check.py``'s
``*_frame.csv.gz``, written beside its JSON): where each layer's time goes between the previous layer's last
down-proj task and its own.

Per layer (µs): ``qkv_span`` (the previous DOWN stage's last end → the QKV stage's last end) with the QKV tasks'
median ``qkv_stage`` / ``qkv_mv`` / ``qkv_epi`` phases; ``attn_span`` (→ the attention stage's last end) with the
critical attention task's phases (``timeline.attn_critical``'s per-layer parts); ``o_span``, ``g_span``,
``d_span`` (→ the O-proj, gate-up and down stages' last ends). Their sum is the layer's time.

    python benchmarks/chain_breakdown.py FRAME.csv.gz [--out chain.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bubblescope.megakernel_engine.timeline import attn_critical, edge_summary, stage_edges, task_phases

STAGES = ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")


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
        for a, b, name in (("QKV", "ATTN", "attn_span"), ("ATTN", "OPROJ", "o_span"), ("OPROJ", "GATEUP", "g_span"),
                           ("GATEUP", "DOWN", "d_span")):
            row[name] = e[b] - e[a]
        rows.append(row)
        prev = e["DOWN"]
    return pd.DataFrame(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frame", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not a.frame.is_file():
        print(f"chain_breakdown: {a.frame}: no such file", file=sys.stderr)
        return 2
    df = pd.read_csv(a.frame)
    chain = layer_chain(df)
    med = chain.drop(columns=["layer"]).median().round(3).to_dict()
    doc = {"frame": a.frame.name, "layers": int(len(chain)), "median_us": med,
           "layer_us_p50": round(float(chain.drop(columns=["layer", "qkv_stage", "qkv_mv", "qkv_epi"]).sum(axis=1,
                                                                                                      min_count=5).median()), 3),
           "attn_critical": attn_critical(df), "task_phases": task_phases(df), "edges": edge_summary(stage_edges(df)),
           "per_layer": chain.round(3).to_dict(orient="records")}
    print(chain.round(2).to_string(index=False))
    print(json.dumps({k: doc[k] for k in ("median_us", "layer_us_p50", "attn_critical")}, indent=1))
    if a.out:
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
