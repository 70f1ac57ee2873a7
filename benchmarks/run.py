"""One driver for the benchmarks: a suite is a list of cases, each run as its own process with a time limit and a
log; the environment is recorded once, a manifest after every case, and the records are packed into a tarball.

    PYTHONPATH=src python3 benchmarks/run.py --suite SUITE [--models a,b] [--out DIR] [--time-limit S] [--dry-run]
                                            [-- extra arguments for each case's script]

Suites (``--models`` default: llama-3.2-1b):

* ``decode``: ``decode_latency.py`` per model (its JSON: ``models`` → model → ``engines`` → engine →
  ``token_ms_p50`` and the rest, with device, date, commit and versions).
* ``ladder``: ``decode_latency.py`` over :data:`LADDER`, eager → CUDA graph → compile → fused → fused + PDL →
  megakernel without prefetch → megakernel; an engine the registry does not know or the device cannot run is
  recorded as skipped with the reason. Then the fused engine's tile sweep (``fused_sweep.py``) and its per-kernel
  profile without PDL, with it, and with PDL's early trigger (``fused_profile.py``).
* ``prefill``: ``benchmarks/prefill.py``'s ``main(argv)`` per model, given ``--models`` and ``--out`` as
  ``decode_latency.py`` takes them; skipped (not available) while that script is not in the tree.
* ``fp8``: ``decode_latency.py --weights fp8`` over :data:`FP8_ENGINES` (each engine in bf16 and as
  ``<engine>+fp8``; ``megakernel+fp8`` runs the Gluon kernel on Hopper, ``megakernel-triton+fp8`` the Triton one);
  skipped (not available) while
  ``decode_latency.py`` has no ``--weights`` option.
* ``counters``: ``bubblescope diagnose model --counters`` per model (Nsight Compute on each engine's top
  kernels), and ncu's raw CSV of one Gluon megakernel decode step (``ncu_target.py``).
* ``gpu-tests``: ``pytest -m gpu`` over ``tests/``, with its log.
* ``trace-parse``: ``trace_parse.py`` (whole ``diagnose trace`` processes against Holistic Trace Analysis).
* ``sanitize``: compute-sanitizer memcheck and racecheck on a few decode steps of tiny models.
* ``sweep``: ``gluon_check.py``'s interleaved sweep ``--sweep NAME`` per model and ``--contexts``.

Writes into OUT (default ``$OUT/<suite>`` where ``$OUT`` is set, as on the device machine, else
``runs/<suite>-<UTC time>``): ``env.json`` (GPU name, driver and clocks from nvidia-smi, Python / torch / triton /
transformers versions, commit, date, the command), ``<case>.log`` (the case's output, then ``rc=N``), whatever each
case's script writes, and ``manifest.json`` (per case: command, limit, status ``ok`` / ``failed`` / ``timeout`` /
``skipped``, exit code, seconds, headline), rewritten after every case so a run cut short keeps what it measured;
then ``OUT.tgz`` beside OUT. Exit code: 0 when no case failed or timed out, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
PY = sys.executable
LADDER = ("reference,reference-cudagraph,reference-compile,reference-fused,reference-fused-pdl,"
          "megakernel-noprefetch,megakernel")
SUITES = ("decode", "ladder", "prefill", "fp8", "counters", "gpu-tests", "trace-parse", "sanitize", "sweep")
# seconds per case: what each suite's cases took on an H200 with room to spare (benchmarks/results/README.md)
TIME_LIMIT_S = {"decode": 300, "ladder": 400, "prefill": 300, "fp8": 300, "counters": 300, "gpu-tests": 500,
                "trace-parse": 600, "sanitize": 200, "sweep": 200}
# The fp8 suite's engines: those with an FP8 path, the reference whose tokens the accuracy check forces among them
# (megakernel's FP8 entry runs the Gluon kernel on Hopper, megakernel-triton's the Triton kernel).
FP8_ENGINES = "reference,reference-compile,reference-fused,reference-fused-pdl,megakernel,megakernel-triton"


@dataclass
class Case:
    """One process of a suite. ``argv`` is None for a case known not to run (``skip`` says why); ``stdout`` names
    a file that takes the process's stdout instead of the log (ncu's CSV)."""

    name: str
    argv: list[str] | None
    limit_s: float
    skip: str | None = None
    stdout: str | None = None
    record: str | None = None   # the JSON the case writes, read for the headline


@dataclass
class Outcome:
    name: str
    command: str | None
    limit_s: float
    status: str
    rc: int | None = None
    seconds: float | None = None
    headline: str = ""
    files: list[str] = field(default_factory=list)


def _script(name: str, *args: str) -> list[str]:
    return [PY, str(BENCH / name), *args]


def _main_call(script: Path, *args: str) -> list[str]:
    """A process that calls ``script``'s ``main(argv)`` with ``args`` and exits with its return value."""
    code = ("import runpy, sys; m = runpy.run_path(sys.argv[1]); sys.exit(m['main'](sys.argv[2:]))")
    return [PY, "-c", code, str(script), *args]


def decode_latency_options() -> set[str]:
    """The option strings ``decode_latency.py`` accepts in this tree (``fp8`` needs ``--weights``)."""
    spec = importlib.util.spec_from_file_location("decode_latency", BENCH / "decode_latency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {o for a in mod.build_parser()._actions for o in a.option_strings}


def plan(suite: str, models: list[str], out: Path, limit: float, extra: list[str], sweep: str = "noise",
         contexts: tuple[int, ...] = (128,)) -> list[Case]:
    """The cases of ``suite`` for ``models``, writing into ``out``; ``extra`` is appended to each case's script
    arguments. Pure: nothing runs, only the tree is looked at (which scripts and options exist)."""
    cases = []
    if suite in ("decode", "ladder", "fp8"):
        weights = []
        if suite == "fp8":
            if "--weights" not in decode_latency_options():
                return [Case("decode_latency_fp8", None, limit,
                             skip="not available: decode_latency.py has no --weights option")]
            weights = ["--weights", "fp8", "--engines", FP8_ENGINES]
        for m in models:
            tag = {"decode": m, "ladder": f"ladder_{m}", "fp8": f"fp8_{m}"}[suite]
            rec = out / f"decode_latency_{tag}.json"
            engines = ["--engines", LADDER] if suite == "ladder" else []
            cases.append(Case(f"decode_latency_{tag}", _script(
                "decode_latency.py", "--models", m, *engines, *weights, "--out", str(rec),
                "--max-seconds", str(max(30, int(limit) - 20)), *extra), limit, record=str(rec)))
            if suite == "ladder":  # the fused rung's tiles and where its step goes, per kernel
                rec = out / f"fused_sweep_{m}.json"
                cases.append(Case(f"fused_sweep_{m}", _script(
                    "fused_sweep.py", "--models", m, "--out", str(rec), "--max-seconds", "120"), 180, record=str(rec)))
                for tag, pdl in (("", []), ("_pdl", ["--pdl", "--pdl-early", "0"]),
                                 ("_pdl_early", ["--pdl", "--pdl-early", "1"])):
                    rec = out / f"fused_profile_{m}{tag}.json"
                    cases.append(Case(f"fused_profile_{m}{tag}", _script(
                        "fused_profile.py", "--model", m, *pdl, "--out", str(rec)), 90, record=str(rec)))
    elif suite == "prefill":
        script = BENCH / "prefill.py"
        for m in models:
            rec = out / f"prefill_{m}.json"
            if not script.is_file():
                cases.append(Case(f"prefill_{m}", None, limit, skip="not available: benchmarks/prefill.py is not in "
                                                                    "this tree"))
            else:
                cases.append(Case(f"prefill_{m}", _main_call(script, "--models", m, "--out", str(rec), *extra),
                                  limit, record=str(rec)))
    elif suite == "counters":
        ncu = shutil.which("ncu")
        for m in models:
            cases.append(Case(f"counters_{m}", [PY, "-m", "bubblescope", "diagnose", "model", m, "--engines",
                                                "megakernel,reference-compile", "--counters", "--runs", "1",
                                                "--out", str(out / f"counters_{m}"), *extra], limit))
            if ncu is None:
                cases.append(Case(f"ncu_{m}", None, limit, skip="ncu (Nsight Compute) not found on PATH"))
                continue
            if str(ROOT / "src") not in sys.path:
                sys.path.insert(0, str(ROOT / "src"))
            from bubblescope.profiler.ncu import METRICS  # the metrics diagnose --counters reads
            cases.append(Case(f"ncu_{m}", [ncu, "--csv", "--print-units", "base", "--clock-control", "none",
                                           "--target-processes", "all", "--launch-skip", "16", "--launch-count", "1",
                                           "-k", "regex:megakernel", "--metrics", ",".join(METRICS),
                                           *_script("ncu_target.py", m)], limit, stdout=f"ncu_{m}.csv"))
    elif suite == "gpu-tests":
        cases.append(Case("pytest_gpu", [PY, "-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests"),
                                         "-p", "no:cacheprovider", *extra], limit))
    elif suite == "trace-parse":
        rec = out / "trace_parse.json"
        cases.append(Case("trace_parse", _script("trace_parse.py", "--out", str(rec), *extra), limit, record=str(rec)))
    elif suite == "sanitize":
        tool = shutil.which("compute-sanitizer")
        for check in ("memcheck", "racecheck"):
            argv = [tool, "--tool", check, "--print-limit", "20", *_script("sanitize_megakernel.py", "gluon", *extra)]
            cases.append(Case(f"sanitizer_{check}", argv if tool else None, limit,
                              skip=None if tool else "compute-sanitizer not found on PATH"))
            argv = [tool, "--tool", check, "--print-limit", "20", *_script("sanitize_fused.py")]
            cases.append(Case(f"sanitizer_fused_{check}", argv if tool else None, limit,
                              skip=None if tool else "compute-sanitizer not found on PATH"))
    elif suite == "sweep":
        for m in models:
            for c in contexts:
                rec = out / f"gluon_check_{sweep}_{m}-{c}.json"
                cases.append(Case(f"gluon_check_{sweep}_{m}-{c}", _script(
                    "gluon_check.py", "--model", m, "--context", str(c), "--sections", "sweep", "--sweep", sweep,
                    "--timed", "160", "--rounds", "4", "--out", str(rec), *extra), limit, record=str(rec)))
    else:
        raise ValueError(f"unknown suite {suite!r}")
    return cases


def commit() -> str | None:
    """``$BUBBLESCOPE_COMMIT`` (a copied tree's .git may be stale), else ``git rev-parse HEAD``."""
    if os.environ.get("BUBBLESCOPE_COMMIT"):
        return os.environ["BUBBLESCOPE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(argv: list[str], env: dict) -> dict:
    """The machine and software a run measured: nvidia-smi's GPU rows (name, driver, SM / memory clocks), the
    versions of Python and the packages, the commit, the UTC date and the command."""
    gpus = None
    if smi := shutil.which("nvidia-smi"):
        q = subprocess.run([smi, "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.mem",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        gpus = [line.strip() for line in q.stdout.splitlines() if line.strip()] or q.stderr.strip()
    code = ("import json, importlib.metadata as md\nv = {}\nfor p in ('torch', 'triton', 'transformers', 'numpy', "
            "'msgspec'):\n    try:\n        v[p] = md.version(p)\n    except md.PackageNotFoundError:\n        v[p] = None\n"
            "print(json.dumps(v))")
    ver = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": env.get(
        "BUBBLESCOPE_COMMIT"), "command": argv, "python": sys.version.split()[0], "gpus": gpus,
            "versions": json.loads(ver.stdout) if ver.returncode == 0 else ver.stderr[-500:]}


def headline(case: Case, log: Path, out: Path) -> str:
    """One line for the manifest: from a decode-latency record, each model's ok engines' p50 (ms) and how many
    were skipped; else the log's last summary line (pytest's counts, a script's last print)."""
    if case.record and Path(case.record).is_file():
        try:
            doc = json.loads(Path(case.record).read_text())
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("models"), dict):
            parts = []
            for model, entry in doc["models"].items():
                engines = entry.get("engines", {})
                ok = [f"{n} {r['token_ms_p50']:.3f}" for n, r in engines.items() if r.get("status") == "ok"]
                skipped = sum(r.get("status") == "skipped" for r in engines.values())
                parts.append(f"{model}: p50 ms " + ", ".join(ok) + (f"; {skipped} skipped" if skipped else ""))
            return "; ".join(parts)
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not ln.startswith("rc=")]
    return (lines[-1] if lines else "")[:200]


def run_case(case: Case, out: Path, env: dict) -> Outcome:
    """Run ``case`` in its own process group, its output in ``out/<name>.log`` (stdout to ``case.stdout`` when
    set) and ``rc=N`` at the end; past ``case.limit_s`` the whole group is killed: status ``timeout``, rc 124."""
    if case.argv is None:
        return Outcome(case.name, None, case.limit_s, "skipped", headline=case.skip or "")
    log = out / f"{case.name}.log"
    t0 = time.monotonic()
    with open(log, "w") as lf, open(out / case.stdout, "w") if case.stdout else open(os.devnull, "w") as sf:
        proc = subprocess.Popen(case.argv, cwd=ROOT, env=env, stdout=sf if case.stdout else lf,
                                stderr=subprocess.STDOUT if not case.stdout else lf, start_new_session=True)
        try:
            rc = proc.wait(timeout=case.limit_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, status = 124, "timeout"
    with open(log, "a") as lf:
        lf.write(f"\nrc={rc}\n")
    files = [p.name for p in (log, out / case.stdout if case.stdout else None, Path(case.record) if case.record
                              else None) if p is not None and p.exists()]
    return Outcome(case.name, " ".join(case.argv), case.limit_s, status, rc, round(time.monotonic() - t0, 1),
                   headline(case, log, out), files)


def _write_json(path: Path, doc) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def child_env(wheels: Path | None, out: Path) -> dict:
    """The cases' environment: ``src`` first on PYTHONPATH (the tree measured is this one), the commit, unbuffered
    output, NVLink multicast off for NCCL; with carried wheels (``--wheels``), those installed into a folder that
    is put on PYTHONPATH too (the device machine reaches no package index)."""
    env = dict(os.environ)
    paths = [str(ROOT / "src")]
    if wheels is not None and any(wheels.glob("*.whl")):
        site = out.parent / f".{out.name}-site"
        subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
                        "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))], check=True)
        paths.append(str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    if c := commit():
        env["BUBBLESCOPE_COMMIT"] = c
    return env


def pack(out: Path) -> Path:
    """``OUT.tgz`` beside ``out`` with everything in it but per-task frame dumps (``*_frame.csv.gz``, large)."""
    tgz = out.with_name(out.name + ".tgz")
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(out, arcname=out.name, filter=lambda ti: None if ti.name.endswith("_frame.csv.gz") else ti)
    return tgz


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, choices=SUITES)
    ap.add_argument("--models", default="llama-3.2-1b", help="comma-separated presets")
    ap.add_argument("--out", type=Path, default=None, help="folder for the records (default: $OUT/<suite> or "
                                                           "runs/<suite>-<UTC time>)")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per case (default: the suite's)")
    ap.add_argument("--sweep", default="noise", help="gluon_check.py sweep of the sweep suite")
    ap.add_argument("--contexts", default="128", help="contexts of the sweep suite")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="wheels to install first (if any)")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and exit")
    args = ap.parse_args(own)
    models = [m for m in args.models.split(",") if m]
    if not models:
        ap.error("--models: no model names")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or (Path(os.environ["OUT"]) / args.suite if os.environ.get("OUT")
                       else ROOT / "runs" / f"{args.suite}-{stamp}")
    limit = args.time_limit or TIME_LIMIT_S[args.suite]
    cases = plan(args.suite, models, out, limit, extra, args.sweep,
                 tuple(int(c) for c in args.contexts.split(",") if c.strip()))
    if args.dry_run:
        for c in cases:
            print(f"{c.name}: " + (f"skipped: {c.skip}" if c.argv is None else f"[{c.limit_s:.0f} s] "
                                   + " ".join(c.argv)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(args.wheels if args.wheels.is_dir() else None, out)
    _write_json(out / "env.json", environment([PY, *sys.argv], env))
    outcomes: list[Outcome] = []
    for case in cases:
        print(f"=== {case.name} {dt.datetime.now().strftime('%H:%M:%S')}", flush=True)
        outcomes.append(run_case(case, out, env))
        o = outcomes[-1]
        print(f"{o.status}" + (f" rc={o.rc} {o.seconds} s" if o.rc is not None else "") + f": {o.headline}",
              flush=True)
        _write_json(out / "manifest.json", {"suite": args.suite, "models": models,
                                            "cases": [asdict(x) for x in outcomes]})
    print(f"packed {pack(out)}")
    return 1 if any(o.status in ("failed", "timeout") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
