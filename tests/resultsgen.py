"""Hand-built results documents for the report, findings and gate tests.

Every number here is typed in by hand (H200-like ceilings from shared/README.md, a Llama-3.2-1B-sized
model), not copied from diagnose output, so tests check the reports against an independent source.
Each builder returns a fresh dict; tests mutate it to trigger one rule or break one key.
"""

from __future__ import annotations

import copy

KERNEL_CPP = "void f<int, 4>()"
WEIGHT_BYTES = 2_480_000_000
KV_BYTES_PER_TOKEN = 32_768  # 2 (K, V) × 16 layers × 8 KV heads × 64 head_dim × 2 bytes


def _latency(p50, p90, p99, ttft, decode_share, samples):
    return {"ttft_ms": ttft, "token_ms_mean": round(sum(samples) / len(samples), 6), "token_ms_p50": p50,
            "token_ms_p90": p90, "token_ms_p99": p99, "tok_per_s": round(1000 / p50, 3),
            "decode_share": decode_share, "token_ms_samples": samples, "ttft_ms_samples": [ttft, ttft + 0.1]}


def _sweep(p50s):
    rows = []
    for context, p50 in zip((128, 1024, 4096), p50s):
        kv = KV_BYTES_PER_TOKEN * context
        nbytes = WEIGHT_BYTES + kv
        gbps = round(nbytes / (p50 * 1e6), 3)
        rows.append({"context": context, "token_ms_p50": p50, "bytes_per_step": nbytes, "kv_bytes_per_step": kv,
                     "effective_GBps": gbps, "util_peak": round(gbps / 4814.3, 5)})
    return rows


def _cudagraph_engine():
    kernels = []
    t = 2.0
    for layer in range(4):
        for name, cat, dur in ((KERNEL_CPP, "gemv", 30.0), ("rms_norm_kernel", "norm", 4.0),
                               ("flash_fwd_splitkv_kernel", "attention", 12.0)):
            kernels.append({"name": name, "category": cat, "stream": 7, "start_us": t, "dur_us": dur})
            t += dur + 1.5
    return {
        "name": "reference-cudagraph", "description": "op-by-op PyTorch, one CUDA graph per step",
        "status": "ok", "reason": None,
        "latency": _latency(1.1, 1.12, 1.15, 12.5, 0.93, [1.08, 1.09, 1.1, 1.1, 1.1, 1.11, 1.12, 1.15]),
        "bandwidth": {"bytes_per_step": 2_485_242_880, "kv_bytes_per_step": 5_242_880, "effective_GBps": 2259.3,
                      "util_peak": 0.4693, "util_copy": 0.5304},
        "timeline": {
            "available": True, "reason": None, "steps": 8, "device": 0, "kernels_per_step": 180,
            "launches_per_step": 1, "launches_per_s": 905.0, "bubble_ratio": 0.06,
            "bubble_ratio_steps": [0.05, 0.06, 0.07], "launch_share": 0.012, "sync_share": 0.85,
            "gpu_busy_us_per_step": 1034.0, "step_wall_us": 1100.0,
            "idle": {"host_wait_us": 40.0, "kernel_wait_us": 20.0, "other_us": 6.0, "threshold_us": 30.0},
            "launch_delay_us": {"p50": 6.5, "p90": 9.0, "max": 14.0},
            "top_kernels": [{"name": KERNEL_CPP, "category": "gemv", "count": 112, "total_us": 7200.0, "share": 0.87},
                            {"name": "rms_norm_kernel", "category": "norm", "count": 33, "total_us": 400.0,
                             "share": 0.048}],
            "categories": [{"category": "gemv", "count": 112, "total_us": 7200.0, "share": 0.87},
                           {"category": "norm", "count": 33, "total_us": 400.0, "share": 0.048},
                           {"category": "attention", "count": 16, "total_us": 680.0, "share": 0.082}],
            "max_registers_per_thread": 128,
            "step_timeline": {"kernels": kernels,
                              "launches": [{"name": "cudaGraphLaunch", "start_us": 0.0, "dur_us": 9.0}]}},
        "intrakernel": None, "compile": None,
        "correctness": {"reference": "reference", "steps": 32, "token_agreement": 1.0,
                        "max_abs_logit_diff": 0.0, "rel_logit_err": 0.0},
        "sweep": _sweep((1.1, 1.115, 1.16)), "trace_path": "runs/reference-cudagraph.json.gz"}


def _megakernel_engine():
    tasks = []
    for program in range(4):
        t = 0.0
        for layer in range(2):
            for opcode, busy in (("qkv", 20.0), ("attn", 8.0), ("oproj", 10.0), ("mlp", 40.0)):
                wait = 1.0 + program * 0.5
                tasks.append({"program": program, "opcode": opcode, "layer": layer, "start_us": t,
                              "ready_us": t + wait, "end_us": t + wait + busy})
                t += wait + busy
        tasks.append({"program": program, "opcode": "lm_head", "layer": None, "start_us": t,
                      "ready_us": t + 2.0, "end_us": t + 52.0})
    return {
        "name": "megakernel", "description": "Triton persistent megakernel", "status": "ok", "reason": None,
        "latency": _latency(0.8, 0.81, 0.83, 10.0, 0.95, [0.79, 0.8, 0.8, 0.8, 0.81, 0.83]),
        "bandwidth": {"bytes_per_step": 2_485_242_880, "kv_bytes_per_step": 5_242_880, "effective_GBps": 3106.6,
                      "util_peak": 0.6453, "util_copy": 0.7293},
        "timeline": {
            "available": True, "reason": None, "steps": 6, "device": 0, "kernels_per_step": 1,
            "launches_per_step": 1, "launches_per_s": 1250.0, "bubble_ratio": 0.04,
            "bubble_ratio_steps": [0.04, 0.04], "launch_share": 0.01, "sync_share": 0.9,
            "gpu_busy_us_per_step": 768.0, "step_wall_us": 800.0,
            "idle": {"host_wait_us": 25.0, "kernel_wait_us": 0.0, "other_us": 7.0, "threshold_us": 30.0},
            "launch_delay_us": {"p50": 5.0, "p90": 6.0, "max": 8.0},
            "top_kernels": [{"name": "megakernel_persistent", "category": "megakernel", "count": 6,
                             "total_us": 4608.0, "share": 1.0}],
            "categories": [{"category": "megakernel", "count": 6, "total_us": 4608.0, "share": 1.0}],
            "max_registers_per_thread": 128,
            "step_timeline": {"kernels": [{"name": "megakernel_persistent", "category": "megakernel", "stream": 7,
                                           "start_us": 8.0, "dur_us": 768.0}],
                              "launches": [{"name": "cuLaunchKernel", "start_us": 0.0, "dur_us": 6.0}]}},
        "intrakernel": {"wait_ratio": 0.05, "programs": 4, "tasks_per_step": len(tasks),
                        "by_opcode": [{"opcode": "qkv", "tasks": 8, "busy_us": 160.0, "wait_us": 14.0},
                                      {"opcode": "mlp", "tasks": 8, "busy_us": 320.0, "wait_us": 14.0}],
                        "tasks": tasks},
        "compile": {"registers": 128, "spills": 0, "shared_bytes": 16384, "num_warps": 4, "programs_per_sm": 4,
                    "grid": 528},
        "correctness": {"reference": "reference", "steps": 32, "token_agreement": 1.0,
                        "max_abs_logit_diff": 0.03125, "rel_logit_err": 0.0011},
        "sweep": _sweep((0.8, 0.812, 0.85)), "trace_path": None}


def healthy_doc() -> dict:
    """A valid document on which no finding rule fires: two ok engines, one skipped, one failed."""
    return copy.deepcopy({
        "schema": "bubblescope.results/1", "created": "2026-11-29T10:00:00Z",
        "command": "bubblescope diagnose model llama-3.2-1b",
        "versions": {"bubblescope": "0.1.0", "python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0",
                     "transformers": "5.17.0", "cuda": "13.0", "driver": "580.65"},
        "device": {"type": "cuda", "name": "NVIDIA H200", "sm_count": 132, "l2_bytes": 62_914_560,
                   "nvml_peak_GBps": 4814.3, "copy_GBps": 4260.0, "max_sm_clock_MHz": 1980,
                   "max_mem_clock_MHz": 3201, "bus_width_bits": 6016, "notes": ["clocks not locked"]},
        "model": {"name": "llama-3.2-1b", "source": "dummy", "path": None, "parameters": 1_235_814_400,
                  "weight_bytes": 2_471_628_800, "dtype": "bfloat16",
                  "config": {"hidden_size": 2048, "num_hidden_layers": 16}},
        "workload": {"prompt_len": 32, "gen_len": 128, "runs": 5, "warmup": 2, "context_sweep": [128, 1024, 4096],
                     "seed": 0},
        "engines": [
            _megakernel_engine(), _cudagraph_engine(),
            {"name": "hf", "description": "transformers generate()", "status": "skipped",
             "reason": "transformers is not installed", "latency": None, "bandwidth": None, "timeline": None,
             "intrakernel": None, "compile": None, "correctness": None, "sweep": [], "trace_path": None},
            {"name": "reference-compile", "description": "torch.compile", "status": "failed",
             "reason": "torch.compile raised InductorError", "latency": None, "bandwidth": None, "timeline": None,
             "intrakernel": None, "compile": None, "correctness": None, "sweep": [], "trace_path": None},
        ],
        "findings": [],
    })


def null_metrics_doc() -> dict:
    """A valid CPU-only document whose ok engines measured nothing but host latency keys (all null)."""
    doc = healthy_doc()
    doc["device"] = {"type": "cpu", "name": "x86_64 (2 cores)", "sm_count": None, "l2_bytes": None,
                     "nvml_peak_GBps": None, "copy_GBps": None, "max_sm_clock_MHz": None, "max_mem_clock_MHz": None,
                     "bus_width_bits": None, "notes": []}
    doc["versions"].update(cuda=None, driver=None)
    for eng in doc["engines"]:
        if eng["status"] != "ok":
            continue
        eng["latency"] = {k: None for k in eng["latency"]}
        eng["bandwidth"] = {k: None for k in eng["bandwidth"]}
        eng["timeline"] = {"available": False, "reason": "no CUDA device: no kernel timeline",
                           **{k: None for k in eng["timeline"] if k not in ("available", "reason")}}
        eng.update(intrakernel=None, compile=None, correctness=None, sweep=[], trace_path=None)
    return doc


def engine(doc: dict, name: str) -> dict:
    """The engine entry called ``name`` (for tests to edit in place)."""
    return next(e for e in doc["engines"] if e["name"] == name)


def locate(doc: dict, path: str) -> tuple:
    """``(container, key)`` of a dotted path such as ``"engines[0].latency.token_ms_p50"``."""
    parts = []
    for part in path.split("."):
        name, *indices = part.replace("]", "").split("[")
        parts.append(name)
        parts.extend(int(i) for i in indices)
    obj = doc
    for key in parts[:-1]:
        obj = obj[key]
    return obj, parts[-1]


def a_finding() -> dict:
    """One hand-written finding entry, schema-valid."""
    return {"rule": "launch-bound", "severity": "warn", "engine": "reference", "title": "Launch-bound",
            "evidence": {"bubble_ratio": 0.62, "kernels_per_step": 412}, "advice": "Use CUDA graphs."}


def counters_section() -> dict:
    """A hand-written ``counters`` section: the megakernel's one kernel read by ncu (H200-like values typed in by
    hand), the CUDA-graph engine's two top kernels, and an engine whose counters could not be read."""
    cmd = ["ncu", "--csv", "-m", "bubblescope", "generate", "llama-3.2-1b", "--prompt-ids", "1,2,3,4",
           "--max-new-tokens", "32"]
    metrics = {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 64.7, "lts__t_sector_hit_rate.pct": 2.44,
               "sm__warps_active.avg.pct_of_peak_sustained_active": 12.5, "launch__registers_per_thread": 255.0,
               "dram__bytes_read.sum": 2_473_532_160.0}
    return {"tool": "ncu", "available": True, "reason": None, "engines": [
        {"engine": "megakernel", "available": True, "reason": None, "command": cmd, "kernel_regex": "megakernel",
         "launch_skip": 16, "launch_count": 1,
         "kernels": [{"name": "megakernel_persistent", "launches": 1, "duration_us": 795.52, "metrics": metrics,
                      "units": {}, "stalls": {"barrier": 48.53, "long_scoreboard": 21.57, "wait": 8.19}}]},
        {"engine": "reference-cudagraph", "available": True, "reason": None, "command": cmd, "kernel_regex": None,
         "launch_skip": 2880, "launch_count": 180,
         "kernels": [{"name": KERNEL_CPP, "launches": 112, "duration_us": 7200.0,
                      "metrics": {**metrics, "dram__throughput.avg.pct_of_peak_sustained_elapsed": 71.25,
                                  "launch__registers_per_thread": 40.0},
                      "units": {}, "stalls": {"long_scoreboard": 61.0, "no_instruction": 3.5}},
                     {"name": "rms_norm_kernel", "launches": 33, "duration_us": 400.0, "metrics": {}, "units": {},
                      "stalls": {}}]},
        {"engine": "hf", "available": False, "reason": "ERR_NVGPUCTRPERM: no permission to read counters",
         "command": cmd, "kernel_regex": None, "launch_skip": 0, "launch_count": 1, "kernels": []}]}


def idle(eng: dict, ratio: float | None) -> dict:
    """Set ``eng``'s GPU idle share to ``ratio`` (None: not measured) where a document holds it: the profiled
    window's ``timeline.bubble_ratio`` and ``timeline.gpu_busy_us_per_step`` = (1 − ratio) × the timed p50 in µs
    (a hand-built step whose profiled and timed lengths agree). Returns ``eng["timeline"]``."""
    tl, p50 = eng["timeline"], eng["latency"]["token_ms_p50"]
    tl["bubble_ratio"] = ratio
    tl["gpu_busy_us_per_step"] = None if ratio is None else round((1 - ratio) * p50 * 1e3, 6)
    return tl
