"""Build synthetic Kineto (torch.profiler) Chrome traces for tests, event by event.

Event shapes copy what Kineto writes (see ``../shared/traces``): kernels on the GPU "process" with
``args.device/stream/correlation``, CUDA API calls on the CPU thread with ``args.correlation``,
``record_function`` ranges as ``user_annotation``. Every time is typed in by the test, in µs.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

CPU_PID, CPU_TID = 1, 1


def kernel(
    name: str, ts: float, dur: float, corr: int | None, stream: int = 7, device: int = 0, cat: str = "kernel", **args
) -> dict:
    a = {"device": device, "context": 1, "stream": stream, "External id": corr, **args}
    if corr is not None:
        a["correlation"] = corr
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": a}


def memcpy(
    ts: float, dur: float, corr: int, stream: int = 7, device: int = 0, name: str = "Memcpy DtoD (Device -> Device)"
) -> dict:
    return kernel(name, ts, dur, corr, stream, device, cat="gpu_memcpy", bytes=1024)


def memset(ts: float, dur: float, corr: int, stream: int = 7, device: int = 0) -> dict:
    return kernel("Memset (Device)", ts, dur, corr, stream, device, cat="gpu_memset", bytes=512)


def api(
    name: str, ts: float, dur: float, corr: int, pid: int = CPU_PID, tid: int = CPU_TID, cat: str = "cuda_runtime"
) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": corr, "cbid": 211, "correlation": corr},
    }


def launch(ts: float, dur: float, corr: int, **kw) -> dict:
    return api("cudaLaunchKernel", ts, dur, corr, **kw)


def flow(corr: int, ts_cpu: float, ts_gpu: float, stream: int = 7, device: int = 0, cat: str = "ac2g") -> list[dict]:
    return [
        {"ph": "s", "id": corr, "pid": CPU_PID, "tid": CPU_TID, "ts": ts_cpu, "cat": cat, "name": cat},
        {"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": ts_gpu, "cat": cat, "name": cat, "bp": "e"},
    ]


def annotation(
    name: str, ts: float, dur: float, pid: int = CPU_PID, tid: int = CPU_TID, cat: str = "user_annotation"
) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": 0},
    }


def cpu_op(name: str, ts: float, dur: float, pid: int = CPU_PID, tid: int = CPU_TID) -> dict:
    """A torch operator as Kineto writes it (category ``cpu_op``): ``aten::linear`` and the ops it calls."""
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": 0, "Sequence number": 0}}


def meta_events() -> list[dict]:
    return [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": CPU_PID, "tid": 0, "args": {"name": "python"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
    ]


def document(events: list[dict], rank=0, **top) -> dict:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU", "numSms": 132}]}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    doc.update(top)
    doc["traceEvents"] = list(events)
    return doc


def write(path: Path, doc, gz: bool | None = None) -> Path:
    """Write ``doc`` (a dict, list or raw text/bytes) to ``path``; gzip when ``gz`` or the name ends in .gz."""
    path = Path(path)
    data = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if gz if gz is not None else path.name.endswith(".gz"):
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def marked_steps_trace(path: Path, gpu: str = "NVIDIA H200", walls=(1000, 1200, 1100)) -> Path:
    """A trace of marked decode steps (``bubblescope.decode_step#i``), one 400-µs ``gemv`` kernel each, of the
    given wall times (µs), taken on ``gpu`` (an H200 by default: datasheet 4,800 GB/s); written to ``path``."""
    ev, t = meta_events(), 0.0
    for i, wall in enumerate(walls):
        ev += [annotation(f"bubblescope.decode_step#{i}", t, wall), launch(t + 1, 2, i + 1),
               kernel("gemv", t + 10, 400, i + 1)]
        t += wall
    doc = document(ev, rank=None)
    doc["deviceProperties"][0].update(name=gpu, totalGlobalMem=150_109_880_320)
    return write(path, doc)


def decode_trace_events(marker: str = "bubblescope.decode_step") -> list[dict]:
    """Two decode steps on device 0 and a stray kernel on device 1; the answers are in test_trace_metrics.

    Step 0 [90, 145): k1 [100,110] s7 and k2 [105,120] s8 overlap; k3 [130,133] launched at 125
    (host-wait 10); k4 [134,140] launched at 128 (kernel-wait 1); a 0-µs memcpy at 142 queued at 135
    (kernel-wait 2); a cudaStreamSynchronize of 3 µs. Step 1 [145, 200): one cudaGraphLaunch (150,
    10 µs) replays g1 [165,170], g2 [171,175], g3 [180,185] on stream 9, all with its correlation.
    Outside the steps: a kernel without launch at [300,301] on device 0, and a kernel on device 1
    [500,510] launched at 100 from another thread (tid 2), which is not the step thread.
    """
    ev = [
        annotation(f"{marker}#0", 90, 55),
        annotation(f"{marker}#1", 145, 55),
        annotation(f"{marker}#0", 100, 40, pid=0, tid=7, cat="gpu_user_annotation"),
        annotation("unrelated_range", 80, 200),
        launch(95, 3, 1),
        kernel("gemv_a", 100, 10, 1, stream=7),
        launch(99, 3, 2),
        kernel("rmsnorm_b", 105, 15, 2, stream=8),
        launch(125, 2, 3),
        kernel("gemv_a", 130, 3, 3, stream=7),
        launch(128, 2, 4),
        kernel("silu_c", 134, 6, 4, stream=7),
        api("cudaMemcpyAsync", 135, 1, 5),
        memcpy(142, 0, 5, stream=7),
        api("cudaStreamSynchronize", 141, 3, 6),
        api("cudaGraphLaunch", 150, 10, 50),
        kernel("gemv_a", 165, 5, 50, stream=9),
        kernel("flash_fwd_kernel", 171, 4, 50, stream=9),
        kernel("rmsnorm_b", 180, 5, 50, stream=9),
        kernel("orphan_kernel", 300, 1, 999, stream=7),
        launch(100, 2, 60, tid=2),
        kernel("gemv_a", 500, 10, 60, stream=3, device=1),
    ]
    ev += flow(1, 95, 100) + flow(50, 150, 165, stream=9, cat="async_cpu_to_gpu")
    return meta_events() + ev


def decode_loop_events(steps: int, names, kernel_us: float = 10.0, launch_us: float = 2.0,
                       step_gap_us: float = 50.0, prefill: list[str] | None = None, start: float = 1000.0,
                       first_corr: int = 1) -> tuple[list[dict], dict]:
    """A decode loop without step markers: an optional prefill (one kernel launch per name in ``prefill``), then
    ``steps`` steps, each launching the kernels ``names`` one by one (a list, or a function of the step index
    giving each step's list, all of one length).

    Each launch call takes ``launch_us`` and its kernel starts when the call ends and runs ``kernel_us``; the
    next launch starts when the kernel ends (the host waits: every gap is host-wait). After a step's last kernel
    the host spends ``step_gap_us`` before the next step's first launch (sampling), so a step lasts
    ``len(names) × (launch_us + kernel_us) + step_gap_us`` from its first launch to the next step's. Returns
    ``(events, answers)``, answers: ``step_starts`` (first launch call of each step, µs), ``step_us`` (that
    period), ``prefill_units``.
    """
    ev, t, corr, starts = [], float(start), first_corr, []
    for name in prefill or []:
        ev += [launch(t, launch_us, corr), kernel(name, t + launch_us, kernel_us, corr)]
        t += launch_us + kernel_us
        corr += 1
    t += step_gap_us
    for i in range(steps):
        starts.append(t)
        for name in (names(i) if callable(names) else names):
            ev += [launch(t, launch_us, corr), kernel(name, t + launch_us, kernel_us, corr)]
            t += launch_us + kernel_us
            corr += 1
        t += step_gap_us
    n = len(names(0) if callable(names) else names)
    return meta_events() + ev, {"step_starts": starts, "step_us": n * (launch_us + kernel_us) + step_gap_us,
                                "prefill_units": len(prefill or [])}


def graph_loop_events(steps: int, graph_kernels: list[tuple[str, float, float]], input_us: float = 3.0,
                      start: float = 1000.0) -> tuple[list[dict], dict]:
    """A CUDA-graph decode loop without markers: per step a ``copy_input`` kernel launch (1 µs call, kernel of
    ``input_us`` right after it), a ``cudaGraphLaunch`` (5 µs call) whose replay runs ``graph_kernels``
    (``(name, offset from the graph call's end, duration)``, µs) all with the graph launch's correlation, then a
    ``cudaMemcpyAsync`` (2 µs) of the token whose 1-µs memcpy starts 1 µs after the replay's last kernel ends,
    and a ``cudaStreamSynchronize`` until that copy ends. The next step starts 20 µs after the sync.
    Returns ``(events, answers)``: ``step_starts``, ``replays`` ``[(first_start, last_end, busy_us)]``.
    """
    ev, t, corr, starts, replays = [], float(start), 1, [], []
    for _ in range(steps):
        starts.append(t)
        ev += [launch(t, 1, corr), kernel("copy_input", t + 1, input_us, corr)]
        corr += 1
        g = t + 5
        ev.append(api("cudaGraphLaunch", g, 5, corr))
        spans = [(g + 5 + off, g + 5 + off + dur) for _, off, dur in graph_kernels]
        ev += [kernel(name, a, b - a, corr) for (name, _, _), (a, b) in zip(graph_kernels, spans)]
        busy = _union(spans)
        replays.append((min(a for a, _ in spans), max(b for _, b in spans), busy))
        corr += 1
        last = max(b for _, b in spans)
        ev += [api("cudaMemcpyAsync", g + 6, 2, corr), memcpy(last + 1, 1, corr, name="Memcpy DtoH (Device -> Pinned)")]
        corr += 1
        ev.append(api("cudaStreamSynchronize", g + 8, last + 2 - (g + 8), corr))
        corr += 1
        t = last + 2 + 20
    return meta_events() + ev, {"step_starts": starts, "replays": replays}


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total
