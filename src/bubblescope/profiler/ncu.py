"""Hardware counters from Nsight Compute (``ncu``): run it on a subprocess, parse its ``--csv`` output.

CUPTI's trace says when kernels ran; only the counters say how they used the memory system: DRAM throughput
as a share of peak, L2 hit rate, achieved occupancy (warps active), registers per thread, and why warps
stalled. :func:`run_ncu` profiles a few launches of a command (``bubblescope generate`` of one engine) with
``--clock-control none`` (the clocks the user runs at, as the rest of bubblescope measures) and
``--print-units base`` (bytes, nanoseconds: no auto-scaled units to undo); :func:`parse_ncu_csv` reads the
long-format CSV ncu prints (one row per kernel launch and metric, columns ``"ID","Process ID","Process
Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name",
"Metric Name","Metric Unit","Metric Value"``). Where ncu is missing or cannot read the counters (no
permission: ``ERR_NVGPUCTRPERM``), the section says why and the caller goes on.

Metric names are ncu's own (Nsight Compute "Kernel Profiling Guide", metrics reference), kept verbatim as
JSON keys so a reader can look them up.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import BubblescopeError

# DRAM throughput as % of peak, L2 hit rate, achieved occupancy, bytes read, duration, launch facts, and the
# warp-stall reasons that matter for a memory-bound, counter-synchronised kernel.
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__grid_size",
    "launch__block_size",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct",
    "smsp__warp_issue_stalled_membar_per_warp_active.pct",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct",
    "smsp__warp_issue_stalled_wait_per_warp_active.pct",
    "smsp__warp_issue_stalled_no_instruction_per_warp_active.pct",
    "smsp__warp_issue_stalled_sleeping_per_warp_active.pct",
)
STALL_PREFIX = "smsp__warp_issue_stalled_"
HEADER = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value")
_TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9,
                  "s": 1e9}
# What ncu prints when the driver refuses counter access to non-admin users.
PERMISSION_CODE = "ERR_NVGPUCTRPERM"


def find_ncu() -> str | None:
    """Path of the ``ncu`` executable: ``$BUBBLESCOPE_NCU``, then PATH, then the CUDA toolkit's usual places."""
    env = os.environ.get("BUBBLESCOPE_NCU")
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("ncu")
    if found:
        return found
    for base in ("/usr/local/cuda/bin", *sorted(str(p) for p in Path("/opt/nvidia").glob("nsight-compute/*"))):
        cand = Path(base) / "ncu"
        if cand.is_file():
            return str(cand)
    return None


def ncu_command(ncu: str, target: list[str], launch_skip: int, launch_count: int, kernel_regex: str | None = None,
                metrics: tuple[str, ...] = METRICS) -> list[str]:
    """The ncu argv profiling launches ``launch_skip`` .. ``launch_skip + launch_count - 1`` (of the kernels
    matching ``kernel_regex``, if given) of ``target``."""
    cmd = [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--target-processes", "all",
           "--launch-skip", str(launch_skip), "--launch-count", str(launch_count), "--metrics", ",".join(metrics)]
    if kernel_regex:
        cmd += ["-k", f"regex:{kernel_regex}"]
    return cmd + list(target)


def _number(text: str) -> float | None:
    # ncu may group thousands with commas ("2,520,124,416"); "n/a" and the like stay None.
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """The metric rows of ncu's ``--csv`` output: ``[{"id", "kernel", "metric", "unit", "value", "text"}]``
    (``value`` float or None, ``text`` as printed; ``id`` the launch's profile ID).

    Lines before the header (the application's own output, ``==PROF==`` messages) and lines that are not
    rows of the header's width are skipped.

    Raises:
        BubblescopeError: no ncu CSV header in ``text``.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"')), None)
    if start is None:
        raise BubblescopeError("ncu output: no CSV header (\"ID\",\"Process ID\",...) found")
    body = [line for line in lines[start:] if line.startswith('"')]
    reader = csv.reader(io.StringIO("\n".join(body)))
    header = next(reader)
    needed = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [name for name in needed if name not in header]
    if missing:
        raise BubblescopeError(f"ncu output: the CSV header lacks {', '.join(missing)}")
    col = {name: header.index(name) for name in needed}
    rows = []
    for rec in reader:
        if len(rec) != len(header):
            continue
        rows.append({"id": int(_number(rec[col["ID"]]) or 0), "kernel": rec[col["Kernel Name"]],
                     "metric": rec[col["Metric Name"]], "unit": rec[col["Metric Unit"]],
                     "value": _number(rec[col["Metric Value"]]), "text": rec[col["Metric Value"]]})
    return rows


def kernel_summary(rows: list[dict], top: int = 5) -> list[dict]:
    """Per kernel name, over its profiled launches: ``{"name", "launches", "duration_us" (sum), "metrics":
    {ncu metric name: mean value over launches}, "units": {metric: unit}}``, the ``top`` longest first.

    ``duration_us`` comes from ``gpu__time_duration.sum`` converted from its unit; None without it.
    """
    by: dict[str, dict] = {}
    for r in rows:
        k = by.setdefault(r["kernel"], {"ids": set(), "values": {}, "units": {}, "ns": 0.0, "timed": False})
        k["ids"].add(r["id"])
        if r["value"] is None:
            continue
        k["values"].setdefault(r["metric"], []).append(r["value"])
        k["units"][r["metric"]] = r["unit"]
        if r["metric"] == "gpu__time_duration.sum" and r["unit"] in _TIME_UNITS_NS:
            k["ns"] += r["value"] * _TIME_UNITS_NS[r["unit"]]
            k["timed"] = True
    out = [{"name": name, "launches": len(k["ids"]), "duration_us": k["ns"] / 1e3 if k["timed"] else None,
            "metrics": {m: sum(v) / len(v) for m, v in k["values"].items()}, "units": k["units"]}
           for name, k in by.items()]
    out.sort(key=lambda k: -(k["duration_us"] or 0.0))
    return out[:top]


def stall_reasons(metrics: dict) -> dict:
    """``{reason: % of active warps}`` from a kernel's ``smsp__warp_issue_stalled_<reason>_per_warp_active.pct``
    metrics, largest first."""
    out = {m[len(STALL_PREFIX):].split("_per_warp_active")[0]: v for m, v in metrics.items()
           if m.startswith(STALL_PREFIX) and v is not None}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _why_not(output: str, returncode: int) -> str:
    if PERMISSION_CODE in output:
        return (f"ncu cannot read the GPU's performance counters ({PERMISSION_CODE}): run as root or allow "
                "profiling for all users (NVreg_RestrictProfilingToAdminUsers=0)")
    err = next((line.strip() for line in output.splitlines() if line.startswith("==ERROR==")), None)
    if err:
        return f"ncu failed: {err[:300]}"
    if "No kernels were profiled" in output:
        return "ncu profiled no kernel (the launch filter matched nothing)"
    return f"ncu exited with code {returncode} and printed no counters"


def run_ncu(target: list[str], launch_skip: int, launch_count: int, kernel_regex: str | None = None,
            metrics: tuple[str, ...] = METRICS, timeout_s: float = 600, top: int = 5, runner=subprocess.run) -> dict:
    """Profile ``target`` (an argv) under ncu; never raises for ncu's own problems.

    Returns:
        ``{"available": bool, "reason": str | None, "command": [argv], "kernels": kernel_summary(...)}``;
        ``available`` False (with the reason) when ncu is missing, times out, lacks counter permission,
        fails, or profiles nothing.
    """
    ncu = find_ncu()
    if ncu is None:
        return {"available": False, "reason": "ncu (Nsight Compute) not found on PATH, in /usr/local/cuda/bin or "
                "$BUBBLESCOPE_NCU", "command": None, "kernels": []}
    cmd = ncu_command(ncu, target, launch_skip, launch_count, kernel_regex, metrics)
    try:
        proc = runner(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"available": False, "reason": f"ncu timed out after {timeout_s:.0f} s", "command": cmd, "kernels": []}
    except OSError as e:
        return {"available": False, "reason": f"ncu could not start ({e.strerror or e})", "command": cmd,
                "kernels": []}
    output = (proc.stdout or "") + "\n" + (proc.stderr or "")
    try:
        rows = parse_ncu_csv(proc.stdout or "")
    except BubblescopeError:
        rows = []
    if not rows:
        return {"available": False, "reason": _why_not(output, proc.returncode), "command": cmd, "kernels": []}
    return {"available": True, "reason": None, "command": cmd, "kernels": kernel_summary(rows, top)}
