"""Record the small real traces the tests commit under tests/data/ (run on a GPU).

Llama-3.2-1B with dummy bf16 weights, reference engine in eager and CUDA-graph modes, a 32-token prompt,
3 warm-up then ``--steps`` profiled decode steps, each a ``bubblescope.decode_step#i`` range. Writes
``h200_reference_<mode>.json.gz`` and ``h200_traces_provenance.json`` (device, date, versions, workload,
the kernels/launches per step our parser found at recording time) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--model", default="llama-3.2-1b")
    args = ap.parse_args(argv)

    import torch

    from bubblescope.models import dummy_weights, get_preset
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.profiler.hardware import device_info
    from bubblescope.profiler.trace.timeline import timeline_summary
    from bubblescope.profiler.trace import load_trace
    from bubblescope.reference_engine import ReferenceEngine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w = dummy_weights(get_preset(args.model), "cuda", torch.bfloat16, seed=0)
    info = device_info("cuda:0")
    prov = {"recorded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "device": info.get("name"), "driver": info.get("driver_version"), "torch": torch.__version__,
            "model": f"{args.model} dummy bf16 weights (seed 0)", "prompt": "token ids 3..34",
            "warmup_steps": 3, "steps": args.steps, "step_marker": "bubblescope.decode_step",
            "command": "PYTHONPATH=src python3 benchmarks/record_test_traces.py", "files": {}}
    for mode in ("eager", "cudagraph"):
        eng = ReferenceEngine(w, mode, 64)
        path = out / f"h200_reference_{mode}.json.gz"
        cap = capture_decode_trace(eng, torch.arange(3, 35), steps=args.steps, warmup=3, out_path=path)
        s = timeline_summary(load_trace(cap.trace_path))
        prov["files"][path.name] = {"bytes": path.stat().st_size, "kernels_per_step": s["kernels_per_step"],
                                    "launches_per_step": s["launches_per_step"], "bubble_ratio": s["bubble_ratio"],
                                    "tokens": cap.tokens}
        print(mode, prov["files"][path.name], flush=True)
    (out / "h200_traces_provenance.json").write_text(json.dumps(prov, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
