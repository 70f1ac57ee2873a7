"""Where the time to first token goes at a short prompt.

Per-run TTFT of ``generate(prompt, 1)`` (Llama-3.2-1B bf16, dummy weights, 128-token prompt) for the megakernel,
then ``reference-compile``, then a second megakernel engine in the same process: each engine's Python
garbage-collection time per run (``gc.callbacks``), its TTFT with the collector off, and two runs under
torch.profiler (GPU self time, the top CPU operators by self time; the second run's trace is written beside the
JSON as ``ttft_<engine>_<n>.json``). GPU only.

    PYTHONPATH=src python3 benchmarks/ttft_probe.py OUT.json
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

ENGINES = ("megakernel", "reference-compile", "megakernel")
RUNS = 10


def main(out: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bubblescope.engines import build_engine
    from bubblescope.generation import generate
    from bubblescope.models import dummy_weights, get_preset

    pauses: list[float] = []   # ms of each collection during a run
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0]) * 1e3)

    gc.callbacks.append(on_gc)
    cfg = get_preset("llama-3.2-1b")
    w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=0)
    prompt = torch.randint(3, cfg.vocab_size, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    doc = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("BUBBLESCOPE_COMMIT"), "runs": {}}
    for n, name in enumerate(ENGINES):
        eng = build_engine(name, w, 4096 + 64)
        generate(eng, prompt, 1, eos_ids=())  # warm-up: compilation, graph capture
        ttft, gc_ms, gc_long = [], [], []
        for _ in range(RUNS):
            pauses.clear()
            ttft.append(generate(eng, prompt, 1, eos_ids=()).ttft_ms)
            gc_ms.append(round(sum(pauses), 3))
            gc_long.append([round(d, 2) for d in pauses if d > 0.5])  # collections over 0.5 ms
        gc.disable()
        no_gc = [generate(eng, prompt, 1, eos_ids=()).ttft_ms for _ in range(RUNS)]
        gc.enable()
        profiled = []
        for i in range(2):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                r = generate(eng, prompt, 1, eos_ids=())
            ev = p.key_averages()
            top = sorted(((e.key, e.count, e.self_cpu_time_total) for e in ev), key=lambda t: -t[2])[:12]
            gpu = sum(getattr(e, "self_device_time_total", 0) or 0 for e in ev)
            profiled.append({"ttft_ms": r.ttft_ms, "gpu_self_us": gpu, "cpu_top": top})
            if i == 1:
                p.export_chrome_trace(os.path.join(os.path.dirname(os.path.abspath(out)), f"ttft_{name}_{n}.json"))
        doc["runs"][f"{name}#{n}"] = {"plain_ttft_ms": ttft, "gc": {"gc_ms": gc_ms, "gc_long": gc_long,
                                                                       "objects": len(gc.get_objects())},
                                      "nogc_ttft_ms": no_gc, "profiled": profiled}
        print(name, [round(x, 2) for x in ttft], "| no gc", [round(x, 2) for x in no_gc], "| profiled",
              [round(r["ttft_ms"], 2) for r in profiled], flush=True)
        del eng
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
