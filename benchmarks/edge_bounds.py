"""Upper bounds, from one decode step's per-task frames, on what finer dependency edges could save per layer.

Reads the frames a ``gluon_check.py --sections timeline`` run keeps (``*_frames.csv.gz``: one row per task with
``name``, ``program``, ``layer``, ``tile`` and the in-kernel stamps in µs) and prints, per whole-vector edge of a
layer (medians over layers):

* ``spread_us``: the upstream stage's last task end less its 10th-percentile end (how early most of the vector is
  final);
* ``hop_us``: the downstream CTAs' first tasks' ready stamp (dependency met) less the upstream's last end;
* ``stage_us`` / ``mv_us``: those first tasks' staging and matvec;
* ``chunk_spread_us``: the same for the consumer's column chunks (``--chunk`` columns, the upstream tasks' rows
  ``--rows`` each): a chunk is final when the last task writing its rows ends, so this is the last chunk's time
  less the first's;
* ``bound_us``: what a per-chunk edge could save at most. A model of the downstream CTA's first task: the whole-vector
  edge ends at ``last + hop + stage + mv``; with per-chunk edges chunk ``c``'s share of the matvec (``mv / chunks``,
  in the ring's order) starts at ``max(previous end, final_c + hop + stage)``. Staging each chunk costs one whole
  staging here and the chunks' round trips overlap freely, so the model favours the chunks; the bound is the median
  over layers of the difference.

and for ATTN → OPROJ the spread of the kv heads' combines (the last attention task of each kv head), the most that
per-kv-head O-proj edges could overlap. These are bounds from where the stamps sit, not predictions.

GATEUP → DOWN lies inside the MLP stretch, which streams its weights at ~97 % of the device copy (NOTES.md, sessions
15-18): there, starting the down tasks earlier moves bytes that are streaming already, so the bound of the chain
(``chain_bound_us``) leaves that edge out and ``all_bound_us`` includes it.

    python benchmarks/edge_bounds.py benchmarks/results/h200-2026-12-02-s18/long_128_llama-3.2-1b_megakernel-gluon_frames.csv.gz
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd

EDGES = [("DOWN", "QKV", 1), ("OPROJ", "GATEUP", 0), ("GATEUP", "DOWN", 0)]  # (upstream, downstream, layer step)
STREAMING = {"GATEUP->DOWN"}  # edges inside the stretch that streams at the copy rate


def chunked_end(final_us: list[float], hop: float, stage: float, mv: float) -> float:
    """When a consumer whose chunks become final at ``final_us`` (in the ring's order) ends its matvec (µs), each
    chunk's share ``mv / len(final_us)`` starting once that chunk is final, hopped and staged."""
    t = float("-inf")
    for f in final_us:
        t = max(t, f + hop + stage) + mv / len(final_us)
    return t


def edge_table(frames: pd.DataFrame, rows_per_task: int = 16, chunk: int = 256) -> pd.DataFrame:
    """One row per (edge, layer): spread_us, chunk_spread_us, hop_us, stage_us, mv_us, bound_us (see the module
    docstring). ``rows_per_task``: rows of x one upstream task writes (its ``tile`` × this is its first row);
    ``chunk``: columns of the consumer's ring slot."""
    rows = []
    for up, down, step in EDGES:
        for layer in sorted(frames.layer.unique()):
            u = frames[(frames.name == up) & (frames.layer == layer)]
            d = frames[(frames.name == down) & (frames.layer == layer + step)]
            if u.empty or d.empty:
                continue
            first = d.sort_values("ts_us").groupby("program").head(1)  # each CTA's first task of the stage
            last = u.end_us.max()
            stage = (first.staged_us - first.ready_us).median()
            mv = (first.mv_end_us - first.staged_us).median()
            hop = first.ready_us.median() - last
            final = u.assign(c=u.tile * rows_per_task // chunk).groupby("c").end_us.max().sort_index().tolist()
            rows.append(dict(edge=f"{up}->{down}", layer=int(layer), spread_us=last - u.end_us.quantile(0.1),
                             chunk_spread_us=max(final) - min(final), hop_us=hop, stage_us=stage, mv_us=mv,
                             bound_us=last + hop + stage + mv - chunked_end(final, hop, stage, mv)))
    return pd.DataFrame(rows)


def kv_head_spread(frames: pd.DataFrame, splits: int) -> pd.Series:
    """Per layer, the last kv head's combine end less the first's (µs); attention tiles are kv_head·splits + split."""
    a = frames[frames.name == "ATTN"]
    ends = a.assign(kvh=a.tile // splits).groupby(["layer", "kvh"]).end_us.max()
    return ends.groupby("layer").agg(lambda e: e.max() - e.min())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frames", help="a *_frames.csv.gz file of one timeline step")
    ap.add_argument("--splits", type=int, default=16, help="attention splits per kv head of that run (default 16)")
    ap.add_argument("--rows", type=int, default=16, help="rows of an O-proj / down task of that run (default 16)")
    ap.add_argument("--chunk", type=int, default=256, help="columns per ring slot of that run (default 256)")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON")
    a = ap.parse_args(argv)
    try:
        frames = pd.read_csv(a.frames)
    except (OSError, ValueError) as e:
        print(f"edge_bounds.py: {a.frames}: {e}", file=sys.stderr)
        return 2
    t = edge_table(frames, a.rows, a.chunk)
    cols = ["spread_us", "chunk_spread_us", "hop_us", "stage_us", "mv_us", "bound_us"]
    med = t.groupby("edge", sort=False)[cols].median()
    kv = kv_head_spread(frames, a.splits).median()
    layers = frames.layer.nunique()
    chain = med.bound_us[[e not in STREAMING for e in med.index]].sum() + kv
    total = med.bound_us.sum() + kv
    if a.json:
        print(json.dumps({"edges": med.round(3).to_dict(orient="index"), "kv_head_spread_us": round(kv, 3),
                          "chain_bound_us": round(chain, 3), "all_bound_us": round(total, 3), "layers": layers},
                         indent=1))
        return 0
    print(med.round(2).to_string())
    print(f"ATTN->OPROJ kv-head combine spread (per-kv-head O-proj edges' bound): {kv:.2f} us")
    print(f"chain bound (without {', '.join(sorted(STREAMING))}): {chain:.2f} us per layer, {chain * layers:.1f} us "
          f"per step over {layers} layers; with it {total:.2f} / {total * layers:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
