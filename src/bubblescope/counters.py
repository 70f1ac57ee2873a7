"""``diagnose model --counters``: Nsight Compute counters of each measured engine's top kernels.

For every engine that ran ok on a GPU, ncu profiles one decode step's worth of launches of
``bubblescope generate`` with that engine, in a subprocess (ncu replays each kernel once per counter pass,
which must not disturb the timed runs), and the top kernels' counters go into the results document's
``counters`` section (``profiler.ncu`` parses them). Launch selection: the megakernel engines filter on the
kernel name ``megakernel`` and skip 16 steps' launches; the others profile every kernel and skip 16 steps'
worth of ``kernels_per_step`` (from the trace), past the warm-up and prefill.
"""

from __future__ import annotations

import sys

from .profiler.ncu import find_ncu, run_ncu, stall_reasons

SKIP_STEPS = 16          # decode steps of launches skipped before the profiled ones
NEW_TOKENS = 32          # tokens the profiled `generate` makes: enough to reach the profiled step
MAX_PROFILED = 300       # launches profiled per engine at most (ncu replays each: keeps it to minutes)
PROMPT_IDS = "1,2,3,4"


def launch_plan(entry: dict) -> dict:
    """``{"kernel_regex", "launch_skip", "launch_count"}`` for an engine entry of the results document."""
    if entry["name"].startswith("megakernel"):
        per_step = int((entry.get("compile") or {}).get("launches_per_step") or 1)
        regex = "megakernel"
    else:
        per_step = int(round((entry.get("timeline") or {}).get("kernels_per_step") or 800))
        regex = None
    per_step = max(1, per_step)
    return {"kernel_regex": regex, "launch_skip": SKIP_STEPS * per_step, "launch_count": min(per_step, MAX_PROFILED)}


def generate_argv(model: str, engine: str, device: str, dtype: str, seed: int, checkpoint: str | None = None,
                  tuning: str | None = None, weights: str | None = None) -> list[str]:
    """The ``bubblescope generate`` command ncu profiles (this interpreter, this package); ``weights``: the run's
    weight format (``model.weights``), passed as ``--weights`` so FP8 kernels are the ones profiled."""
    argv = [sys.executable, "-m", "bubblescope", "generate", model, "--engine", engine, "--prompt-ids", PROMPT_IDS,
            "--max-new-tokens", str(NEW_TOKENS), "--device", device, "--dtype", dtype, "--seed", str(seed)]
    if checkpoint:
        argv += ["--checkpoint", checkpoint]
    if tuning and engine.startswith("megakernel"):
        argv += ["--tuning", str(tuning)]
    if weights:
        argv += ["--weights", weights]
    return argv


def collect_counters(doc: dict, model: str, device: str, dtype: str, seed: int = 0, checkpoint: str | None = None,
                     tuning: str | None = None, run=run_ncu, progress=None) -> dict:
    """The ``counters`` section: ``{"tool": "ncu", "available", "reason", "metrics_source", "workload":
    {"prompt_len", "new_tokens", "skipped_steps"} (what the profiled ``generate`` ran: not the document's
    workload), "engines": [{"engine",
    "available", "reason", "command", "kernel_regex", "launch_skip", "launch_count", "kernels": [{"name",
    "launches", "duration_us", "metrics": {ncu metric: value}, "units", "stalls": {reason: %}}]}]}``.

    ``available`` is False with the reason on a CPU, without ncu, or when no engine's counters could be read;
    the run goes on either way.
    """
    # the counters' own workload, not the document's: the reports say so beside them
    section = {"tool": "ncu", "available": False, "reason": None, "engines": [],
               "workload": {"prompt_len": len(PROMPT_IDS.split(",")), "new_tokens": NEW_TOKENS,
                            "skipped_steps": SKIP_STEPS}}
    if doc["device"]["type"] != "cuda":
        section["reason"] = "CPU run: hardware counters need an NVIDIA GPU and Nsight Compute"
        return section
    if find_ncu() is None and run is run_ncu:
        section["reason"] = "ncu (Nsight Compute) not found on PATH, in /usr/local/cuda/bin or $BUBBLESCOPE_NCU"
        return section
    for entry in doc["engines"]:
        if entry["status"] != "ok":
            continue
        if progress:
            progress(f"{entry['name']}: ncu counters")
        plan = launch_plan(entry)
        res = run(generate_argv(model, entry["name"], device, dtype, seed, checkpoint, tuning,
                                (doc.get("model") or {}).get("weights")), **plan)
        for k in res["kernels"]:
            k["stalls"] = stall_reasons(k["metrics"])
        section["engines"].append({"engine": entry["name"], **plan, **res})
    got = [e for e in section["engines"] if e["available"]]
    section["available"] = bool(got)
    if not got:
        reasons = {e["reason"] for e in section["engines"]}
        section["reason"] = "; ".join(sorted(r for r in reasons if r)) or "no engine ran ok"
    return section

