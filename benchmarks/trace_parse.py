"""Whole ``bubblescope diagnose trace`` processes against Holistic Trace Analysis, on a trace scaled 1× to 100×.

The trace given on the command line (default: ``tests/data/h200_reference_eager.json.gz``, a real
Kineto trace) is first repeated to ``--base-events`` events (the 1× trace; 0 keeps it as is), then
written at each scale in ``--scales``: ``k`` copies of its non-metadata events, each copy shifted past
the previous one's end, with correlation, External id and flow ids offset so no two copies share one,
gzipped. Each (scale, tool) runs as its own process, timed as a user waits for it (interpreter start
and imports included): wall seconds, CPU seconds (user + system) and peak RSS from ``wait4``'s rusage
of that child, and bytes of peak RSS per event. HTA 0.5 pins its own dependencies, so it runs from a
separate virtualenv (``--hta-python``; ``python -m venv /tmp/hta && /tmp/hta/bin/pip install
holistictraceanalysis==0.5.0``) and only up to ``--hta-max-scale`` (it needs ~80 bytes of RAM per byte
of JSON). Both tools' busy time and idle split of rank 0 are recorded side by side (HTA: temporal and
idle-time breakdown, ``include_last_profiler_step=True``, ``consecutive_kernel_delay`` = our threshold).

    python benchmarks/trace_parse.py TRACE.json.gz --base-events 216000 --scales 1,10,50,100 --hta-max-scale 10

``--repeats N`` runs each cell N times (the two tools alternating) and reports the run of median wall
time, every run's figures beside it: on a shared machine one run can be off by a quarter.
``--serial-too`` also times ours with its parse kept in one process (``BUBBLESCOPE_TRACE_WORKERS=0``),
alternating with the default (worker processes on large files). Peak RSS is the largest of the
process and its children (``wait4``), not their sum: a worker's own peak is ~50 MB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "h200_reference_eager.json.gz"

# Run in the HTA child: argv = trace directory, kernel-wait threshold (µs). Prints one JSON line.
HTA_CHILD = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
temporal = ta.get_temporal_breakdown(visualize=False)
idle, _ = ta.get_idle_time_breakdown(visualize=False, consecutive_kernel_delay=int(float(sys.argv[2])))
row = temporal.iloc[0]
print(json.dumps({"busy_us": float(row["compute_time(us)"] + row["non_compute_time(us)"]),
                  "idle_us": float(row["idle_time(us)"]),
                  "idle_by_category_us": {str(k): float(v) for k, v in idle.groupby("idle_category")["idle_time"].sum().items()}}))
"""

VERSIONS = r"""
import json, sys, importlib.metadata as md
out = {"python": sys.version.split()[0]}
for name in ("pandas", "numpy", "msgspec", "typer", "holistictraceanalysis", "bubblescope"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def _load(source: Path) -> dict:
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def make_scaled(doc: dict, base_events: int, scale: int, out: Path) -> dict:
    """Write ``out`` (.json.gz, gzip level 1): ``doc``'s metadata events once, then its other events
    repeated to ``base_events`` × ``scale`` events (``base_events`` 0: all of them, ``scale`` times),
    each copy shifted past the previous one's end, ids offset per copy. Returns
    {events, uncompressed_bytes, gz_bytes}."""
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    timed = [e for e in body if isinstance(e.get("ts"), (int, float))]
    shift = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    ids = [e.get("args", {}).get(k) for e in body for k in ("correlation", "External id")] + [e.get("id") for e in body]
    id_step = max(i for i in ids if isinstance(i, int)) + 1
    target = (base_events or len(body) + len(meta)) * scale - len(meta)
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    tmp = out.with_name(out.name + ".tmp")
    size, written, k = 0, 0, 0
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as fh:

        def put(text: str) -> None:
            nonlocal size
            fh.write(text)
            size += len(text)

        put(json.dumps(head)[:-1] + ', "traceEvents": [\n' + ",\n".join(json.dumps(e) for e in meta))
        while written < target:
            copy = []
            for ev in body[: target - written]:
                e = dict(ev)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + k * shift
                if isinstance(e.get("id"), int):
                    e["id"] = e["id"] + k * id_step
                if isinstance(e.get("args"), dict):
                    a = dict(e["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(a.get(key), int) and a[key] > 0:
                            a[key] += k * id_step
                    e["args"] = a
                copy.append(e)
            put(",\n" + json.dumps(copy)[1:-1].replace("}, {", "},\n{"))
            written += len(copy)
            k += 1
        put("\n]}")
    os.replace(tmp, out)
    return {"events": written + len(meta), "uncompressed_bytes": size, "gz_bytes": out.stat().st_size}


def _timed(cmd: list[str], env: dict, timeout_s: float) -> tuple[dict, str]:
    """Run ``cmd``; (wall_s, cpu_s, peak_rss_bytes, returncode), stdout. Peak RSS is the child's own."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=tempfile.gettempdir())
        deadline = t0 + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    sample = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "returncode": proc.returncode,
        "timed_out": wall > timeout_s,
    }
    if proc.returncode != 0:
        sample["stderr_tail"] = stderr[-2000:]
    return sample, stdout


def _ours(path: Path, threshold_us: float, timeout_s: float, workers: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")
    if workers is not None:  # BUBBLESCOPE_TRACE_WORKERS: 0 keeps the parse in one process
        env["BUBBLESCOPE_TRACE_WORKERS"] = workers
    cmd = [sys.executable, "-m", "bubblescope", "diagnose", "trace", str(path), "--format", "json",
           "--idle-threshold-us", str(threshold_us)]
    sample, stdout = _timed(cmd, env, timeout_s)
    if sample["returncode"] == 0:
        dev = json.loads(stdout)["files"][0]["devices"][0]
        sample["result"] = {"busy_us": dev["busy_us"], "span_us": dev["span_us"], "idle": dev["idle"]}
    return sample


def _hta(python: str, path: Path, threshold_us: float, timeout_s: float) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    sample, stdout = _timed([python, "-c", HTA_CHILD, str(path.parent), str(threshold_us)], env, timeout_s)
    if sample["returncode"] == 0 and stdout.strip():
        sample["result"] = json.loads(stdout.strip().splitlines()[-1])
    return sample


def _median(samples: list[dict]) -> dict:
    """The run of median wall time (the lower middle one for an even count), with every run's wall,
    CPU and peak RSS listed beside it when there were several."""
    pick = dict(sorted(samples, key=lambda x: x["wall_s"])[(len(samples) - 1) // 2])
    if len(samples) > 1:
        for key in ("wall_s", "cpu_s", "peak_rss_bytes"):
            pick[key + "_runs"] = [x[key] for x in samples]
    return pick


def _versions(python: str) -> dict:
    out = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    return json.loads(out.stdout)


def _machine() -> dict:
    cpu, mem = platform.processor(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(x.split()[1]) * 1024 for x in Path("/proc/meminfo").read_text().splitlines()
                   if x.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# `diagnose trace` vs Holistic Trace Analysis {result['versions']['hta'].get('holistictraceanalysis', '(not run)')}",
        "",
        f"{result['date']}, commit {str(result['commit'])[:7]}, {m['cpu']}, {m['cores']} cores, 1-min load "
        f"{result['loadavg_1min'][0]:.2f} before, {result['loadavg_1min'][1]:.2f} after (shared machine). "
        f"Source: `{result['source']}` repeated to {result['base_events']:,} events as 1×. Whole processes "
        f"(start-up and imports included), the median-wall run of {result['repeats']} per cell"
        + (f"; ours with `BUBBLESCOPE_TRACE_WORKERS={result['trace_workers_env']}`."
           if result.get("trace_workers_env") is not None else "."),
        "",
        "| scale | events | gz MB | JSON MB | ours wall s | ours CPU s | ours peak MB | ours B/event "
        "| HTA wall s | HTA peak MB | time ratio | memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in result["cases"]:
        o, h = c["bubblescope"], c.get("hta")
        hs = (f"{h['wall_s']:.1f}" + (" (timed out)" if h["timed_out"] else "") if h else "not run")
        hm = f"{h['peak_rss_bytes'] / 1e6:.0f}" if h else "—"
        ratio = (f"{o['wall_s'] / h['wall_s']:.2f}", f"{o['peak_rss_bytes'] / h['peak_rss_bytes']:.2f}") if (
            h and h["returncode"] == 0) else ("—", "—")
        lines.append(
            f"| {c['scale']}× | {c['events']:,} | {c['gz_bytes'] / 1e6:.1f} | {c['uncompressed_bytes'] / 1e6:.0f} | "
            f"{o['wall_s']:.2f} | {o['cpu_s']:.2f} | {o['peak_rss_bytes'] / 1e6:.0f} | "
            f"{o['peak_rss_bytes'] / c['events']:.0f} | {hs} | {hm} | {ratio[0]} | {ratio[1]} |"
        )
    one = [c for c in result["cases"] if "bubblescope_one_process" in c]
    if one:
        lines += ["", "Ours with the parse in one process (`BUBBLESCOPE_TRACE_WORKERS=0`), alternating with the "
                  "default runs above:", "", "| scale | wall s | CPU s | peak MB | default / one process (wall) |",
                  "|---|---:|---:|---:|---:|"]
        for c in one:
            s, o = c["bubblescope_one_process"], c["bubblescope"]
            lines.append(f"| {c['scale']}× | {s['wall_s']:.2f} | {s['cpu_s']:.2f} | {s['peak_rss_bytes'] / 1e6:.0f} | "
                         f"{o['wall_s'] / s['wall_s']:.2f} |")
    lines += ["", "Agreement (rank 0, µs): ours busy_us / idle split vs HTA temporal and idle-time breakdown.", ""]
    for c in result["cases"]:
        o, h = c["bubblescope"].get("result"), (c.get("hta") or {}).get("result")
        if o and h:
            lines.append(f"- {c['scale']}×: ours busy {o['busy_us']:.3f}, idle {o['idle']['idle_us']:.3f} "
                         f"(host {o['idle']['host_wait_us']:.3f}, kernel {o['idle']['kernel_wait_us']:.3f}, "
                         f"other {o['idle']['other_us']:.3f}); HTA busy {h['busy_us']:.3f}, idle {h['idle_us']:.3f} "
                         f"{h['idle_by_category_us']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=SOURCE, help="Kineto trace to scale (.json/.json.gz)")
    parser.add_argument("--base-events", type=int, default=0, help="events of the 1× trace (0: the trace as is)")
    parser.add_argument("--scales", default="1,10,50,100", help="comma-separated scale factors")
    parser.add_argument("--hta-python", default="/tmp/hta-venv/bin/python", help="python of a venv with HTA 0.5.0")
    parser.add_argument("--hta-max-scale", type=int, default=10, help="largest scale HTA is run on")
    parser.add_argument("--threshold-us", type=float, default=30.0, help="kernel-wait threshold of both tools (µs)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per-process limit")
    parser.add_argument("--repeats", type=int, default=1, help="runs per (scale, tool), alternating; the median "
                        "wall-time run is reported")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trace_parse.json")
    parser.add_argument("--work", type=Path, default=None, help="keep the scaled traces here (default: a temp dir)")
    parser.add_argument("--serial-too", action="store_true", help="also time ours with its parse in one process "
                        "(BUBBLESCOPE_TRACE_WORKERS=0), alternating with the default")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(f"{args.trace}: no such file")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    scales = [int(s) for s in args.scales.split(",")]
    hta = Path(args.hta_python).is_file()
    if not hta:
        print(f"--hta-python {args.hta_python}: not found; timing bubblescope alone", file=sys.stderr)

    load_before = os.getloadavg()[0]
    work = args.work or Path(tempfile.mkdtemp(prefix="bubblescope-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    doc = _load(args.trace)
    cases = []
    try:
        for scale in scales:
            case_dir = work / f"x{scale}"
            case_dir.mkdir(exist_ok=True)
            path = case_dir / "trace.json.gz"
            info_path = work / f"x{scale}.info.json"  # outside the directory HTA reads
            if path.is_file() and info_path.is_file():
                info = json.loads(info_path.read_text())
            else:
                info = make_scaled(doc, args.base_events, scale, path)
                info_path.write_text(json.dumps(info))
            case = {"scale": scale, **info}
            ours, theirs, serial = [], [], []
            for _ in range(args.repeats):  # the tools alternate, so a load swing hits both
                ours.append(_ours(path, args.threshold_us, args.timeout_s))
                print(f"{scale}x: bubblescope {ours[-1]['wall_s']:.2f} s, "
                      f"{ours[-1]['peak_rss_bytes'] / 1e6:.0f} MB", file=sys.stderr)
                if args.serial_too:
                    serial.append(_ours(path, args.threshold_us, args.timeout_s, workers="0"))
                    print(f"{scale}x: bubblescope in one process {serial[-1]['wall_s']:.2f} s, "
                          f"{serial[-1]['peak_rss_bytes'] / 1e6:.0f} MB", file=sys.stderr)
                if hta and scale <= args.hta_max_scale:
                    theirs.append(_hta(args.hta_python, path, args.threshold_us, args.timeout_s))
                    print(f"{scale}x: HTA {theirs[-1]['wall_s']:.2f} s, {theirs[-1]['peak_rss_bytes'] / 1e6:.0f} MB",
                          file=sys.stderr)
            case["bubblescope"] = _median(ours)
            if serial:
                case["bubblescope_one_process"] = _median(serial)
            if theirs:
                case["hta"] = _median(theirs)
            cases.append(case)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "trace_parse",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": _machine(),
        "loadavg_1min": [load_before, os.getloadavg()[0]],
        "source": str(args.trace),
        "base_events": cases[0]["events"] // cases[0]["scale"] if cases else 0,
        "threshold_us": args.threshold_us,
        "repeats": args.repeats,
        "trace_workers_env": os.environ.get("BUBBLESCOPE_TRACE_WORKERS"),  # None: ours picks by size and load
        "commands": {
            "bubblescope": "python -m bubblescope diagnose trace TRACE --format json --idle-threshold-us T",
            "hta": "TraceAnalysis(trace_dir, include_last_profiler_step=True): get_temporal_breakdown, "
                   "get_idle_time_breakdown(consecutive_kernel_delay=T)",
        },
        "versions": {"bubblescope": _versions(sys.executable), "hta": _versions(args.hta_python) if hta else {}},
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((args.out, json.dumps(result, indent=2) + "\n"), (args.out.with_suffix(".md"), _markdown(result))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    print(_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
