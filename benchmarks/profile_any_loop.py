"""``bubblescope profile`` on decode loops bubblescope does not run itself, against ``diagnose model`` on a GPU.

Cases (each in its own process, each under a time limit; ``--cases`` picks some, and a later run updates the
cases it ran in an existing result file, so the work can be split over several commands):

- ``diagnose``: ``bubblescope diagnose model llama-3.2-1b --engines hf,reference-compile`` (128-token prompt,
  128 generated): the utilisation each profiled loop is compared with, and ``diagnose trace --model`` on that
  run's own traces: its GB/s per step from the trace's step times against the run's timeline figures
  (``bandwidth.bytes_per_step`` / ``timeline.step_wall_us``), which must agree within 1 %;
- ``hf``: ``bubblescope profile --model llama-3.2-1b -- python examples/hf_generate.py`` (Hugging Face
  ``model.generate``, eager, bf16, 128-token prompt, 128 new tokens), compared with the ``hf`` engine;
- ``compiled-graphs``, ``compiled-eager``: ``examples/compiled_loop.py --cuda-graphs`` / ``--no-cuda-graphs``
  (a gpt-fast style ``torch.compile``d decode step, ``mode="reduce-overhead"`` with ``--cuda-graphs``), compared
  with ``reference-compile`` (the same model code compiled by inductor, the step captured in a CUDA graph by the
  engine); the graph-less loop has no ``diagnose model`` engine
  of its own, so its ``util_diagnose_model`` is that of ``reference-compile`` with a note;
- ``same-hf``, ``same-compile``: ``bubblescope profile -- python -m bubblescope generate llama-3.2-1b --engine hf``
  (``--engine reference --mode compile``), each with ``--warmup 1``: the very loop ``diagnose model`` times for
  ``hf`` (``reference-compile``), run as a user's program after one untimed generation as ``diagnose model`` runs
  one, the window inside the second after as many of its steps as the window has (the baseline without the
  profiler: the latest skipped steps), so the two utilisations must agree (without it the hf loop's first generation
  ran ~2.5× slower throughout on an H200, most likely its growing KV cache allocating as it goes). The cases above are other programs that only
  resemble those engines (``model.generate`` does more host work a token than a bare forward loop), so for them
  the comparison says how far the user's loop is from bubblescope's engine, not whether ``profile`` measures right.

Each case records ``name``, ``cuda_graphs``, ``steps_found`` (steps the trace analysis found in the window, no
markers), ``tokens_generated`` (steps the profile hooks counted in the same window), ``util_profile``,
``util_diagnose_model``, ``util_rel_diff``, ``util_agrees`` (within 3 % for CUDA-graph loops, 10 % for eager
ones), ``profiler_overhead_pct``, ``util_profile_unprofiled_steps`` (the same bytes over the hooks' median step
time without the profiler), ``util_unprofiled_rel_diff`` and ``util_unprofiled_agrees`` (that figure against
``diagnose model``'s, which times its loop without the profiler: the comparison with the profiler's cost taken out),
``step_ms_unprofiled`` and ``unprofiled_from`` (that median step and where it ran: the skipped steps before the
window), ``step_ms_after_window`` (the steps timed after it, which a CUDA profiler still slows)
and ``graph_replays``, plus the command and its log tail.

    PYTHONPATH=src python3 benchmarks/profile_any_loop.py                   # every case (estimated 8-10 min)
    # or in two commands of under 10 minutes each, the second adding its cases to the same file:
    PYTHONPATH=src python3 benchmarks/profile_any_loop.py --cases diagnose,hf
    PYTHONPATH=src python3 benchmarks/profile_any_loop.py --cases compiled-graphs,compiled-eager
    PYTHONPATH=src python3 benchmarks/profile_any_loop.py --cases same-hf,same-compile

Writes ``benchmarks/results/profile_any_loop.json`` (device, date, commit, versions, cases, trace_check).
``--smoke`` runs the same plumbing on a CPU in a few minutes (tiny models, the compiled loop eager, 24 tokens),
into ``--out`` of your choice: its numbers mean nothing but that every step ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama-3.2-1b"
PROMPT, NEW = 128, 128
CASES = ("diagnose", "hf", "compiled-graphs", "compiled-eager", "same-hf", "same-compile")
TOLERANCE = {True: 0.03, False: 0.10}  # relative utilisation agreement: CUDA-graph loops, eager loops
# case: (program, its arguments, CUDA graphs, the diagnose model engine compared with); program "bubblescope" is
# `python -m bubblescope generate MODEL` with a seeded prompt of PROMPT ids, the rest scripts given --prompt-len
SCRIPTS = {"hf": ("examples/hf_generate.py", [], False, "hf"),
           "compiled-graphs": ("examples/compiled_loop.py", ["--cuda-graphs"], True, "reference-compile"),
           "compiled-eager": ("examples/compiled_loop.py", ["--no-cuda-graphs"], False, "reference-compile"),
           "same-hf": ("bubblescope", ["--engine", "hf", "--warmup", "1"], False, "hf"),
           "same-compile": ("bubblescope", ["--engine", "reference", "--mode", "compile", "--warmup", "1"], True,
                            "reference-compile")}


def _commit() -> str | None:
    """``$BUBBLESCOPE_COMMIT`` when set (a copied tree's .git may be stale), else ``git rev-parse``."""
    if os.environ.get("BUBBLESCOPE_COMMIT"):
        return os.environ["BUBBLESCOPE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - provenance only
        return None


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "triton", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            out[name] = None
    try:
        import torch
        out["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        out["cuda"] = None
    return out


def _device() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return None


def _run(argv: list[str], timeout: float, log: Path) -> dict:
    """Run ``argv`` (stdout and stderr to ``log``) under ``timeout`` seconds: ``{"rc", "seconds", "log_tail"}``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = dt.datetime.now()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    tail = log.read_text(errors="replace").splitlines()[-15:]
    return {"command": " ".join(argv), "rc": rc, "seconds": round((dt.datetime.now() - start).total_seconds(), 1),
            "log_tail": tail}


def _bubblescope() -> list[str]:
    return [sys.executable, "-m", "bubblescope"]


SMOKE = {"model": "tiny-llama", "prompt": 8, "new": 24, "skip": 2, "steps": 8,
         "args": {"hf": ["--tiny"], "compiled-graphs": ["--preset", "tiny-llama", "--no-compile"],
                  "compiled-eager": ["--preset", "tiny-llama", "--no-compile"],
                  "same-compile": ["--mode", "eager"]}}


def _program(script: str, args: list[str]) -> list[str]:
    """The profiled program's argv: a script with the prompt length and new tokens, or ``bubblescope generate``
    of ``MODEL`` with seeded prompt ids (dummy weights: no checkpoint)."""
    if script != "bubblescope":
        return [sys.executable, script, "--prompt-len", str(PROMPT), "--new-tokens", str(NEW), *args]
    import random
    ids = random.Random(0).choices(range(3, 1000), k=PROMPT)  # in every preset's vocabulary
    return _bubblescope() + ["generate", MODEL, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
                             str(NEW), *args]


def run_diagnose(work: Path, timeout: float) -> dict:
    """``diagnose model`` of hf and reference-compile, then ``diagnose trace --model`` of its traces."""
    out = work / "diagnose"
    run = _run(_bubblescope() + ["diagnose", "model", MODEL, "--engines", "hf,reference-compile", "--prompt-len",
                                 str(PROMPT), "--gen-len", str(NEW), "--out", str(out), "--format", "json"],
               timeout, work / "diagnose.log")
    entry = {"run": run, "util": {}, "trace_check": []}
    try:
        doc = json.loads((out / "results.json").read_text())
    except (OSError, ValueError) as exc:
        entry["error"] = f"no results.json ({exc})"
        return entry
    for eng in doc["engines"]:
        if eng.get("status") != "ok":
            continue
        bw, tl = eng.get("bandwidth") or {}, eng.get("timeline") or {}
        entry["util"][eng["name"]] = bw.get("util_peak")
        trace = out / "traces" / f"{eng['name']}.json.gz"
        check = {"engine": eng["name"], "GBps_timeline": None, "GBps_trace": None, "rel_diff": None}
        if bw.get("bytes_per_step") and tl.get("step_wall_us"):
            check["GBps_timeline"] = bw["bytes_per_step"] / tl["step_wall_us"] / 1e3
        res = work / f"trace_{eng['name']}.json"
        check["run"] = _run(_bubblescope() + ["diagnose", "trace", str(trace), "--model", MODEL, "--json", str(res)],
                            timeout, work / f"trace_{eng['name']}.log")
        try:
            row = json.loads(res.read_text())["files"][0]
            check["GBps_trace"] = row.get("effective_GBps")
            check["kv"] = row.get("kv")
        except (OSError, ValueError, LookupError) as exc:
            check["error"] = f"no trace result ({exc})"
        if check["GBps_trace"] and check["GBps_timeline"]:
            check["rel_diff"] = check["GBps_trace"] / check["GBps_timeline"] - 1
            check["agrees"] = abs(check["rel_diff"]) <= 0.01
        entry["trace_check"].append(check)
    return entry


def compare(case: dict) -> None:
    """Set the case's utilisation comparisons with ``diagnose model`` (``util_rel_diff`` / ``util_agrees`` for the
    profiled figure, ``util_unprofiled_rel_diff`` / ``util_unprofiled_agrees`` without the profiler's cost),
    where both figures exist."""
    dm, tol = case.get("util_diagnose_model"), TOLERANCE[case["cuda_graphs"]]
    figures = (("util", case.get("util_profile")), ("util_unprofiled", case.get("util_profile_unprofiled_steps")))
    for key, util in figures:
        if util and dm:
            case[f"{key}_rel_diff"] = util / dm - 1
            case[f"{key}_agrees"] = abs(case[f"{key}_rel_diff"]) <= tol


def run_case(name: str, work: Path, timeout: float, skip: int, steps: int, util_dm: dict,
             extra: list[str] | None = None) -> dict:
    """One ``bubblescope profile`` case (see the module doc); ``extra``: more arguments of the script."""
    script, args, graphs, engine = SCRIPTS[name]
    args = [*args, *(extra or [])]
    out = work / name
    # the trace's first step (step --skip of the run, the profiler's warm-up) reads about PROMPT + skip positions:
    # step s of either loop decodes position PROMPT + s - 1 (step 0 is the prefill), reading PROMPT + s
    if "--warmup" in args:  # `generate --warmup 1` first runs one whole generation (NEW steps) as diagnose model does
        # the baseline without the profiler is the latest `steps` skipped steps: all of them in the timed
        # generation, after its prefill (the warm-up generation's steps run slower, ~52 ms against ~14 for hf on an
        # H100, and would stand in for the program's step time)
        skip = max(skip, steps + 1)
        context, skip = PROMPT + skip, skip + NEW
    else:
        context = PROMPT + skip
    argv = _bubblescope() + ["profile", "--model", MODEL, "--context", str(context), "--skip", str(skip),
                             "--steps", str(steps), "--out", str(out), "--", *_program(script, args)]
    case = {"name": name, "cuda_graphs": graphs, "steps_found": None, "tokens_generated": None,
            "util_profile": None, "util_diagnose_model": util_dm.get(engine), "util_diagnose_model_engine": engine,
            "util_rel_diff": None, "util_agrees": None, "profiler_overhead_pct": None, "graph_replays": None,
            "run": _run(argv, timeout, work / f"{name}.log")}
    if name == "compiled-eager":
        case["note"] = ("diagnose model has no inductor-without-CUDA-graphs engine: compared with "
                        "reference-compile (CUDA graphs), so the utilisations may differ by the launch overhead")
    try:
        doc = json.loads((out / "profile.json").read_text())
    except (OSError, ValueError) as exc:
        case["error"] = f"no profile.json ({exc})"
        return case
    prof, row = doc["profile"], doc["files"][0]
    case.update(steps_found=prof["steps_found"], tokens_generated=prof["tokens_generated"],
                util_profile=row.get("util_peak"), profiler_overhead_pct=prof["profiler_overhead_pct"],
                util_profile_unprofiled_steps=prof.get("util_peak_unprofiled"),
                step_ms_unprofiled=prof.get("step_ms_p50_unprofiled"), unprofiled_from=prof.get("reference_from"),
                step_ms_after_window=prof.get("step_ms_p50_after"),
                graph_replays=prof.get("graph_replays"), steps_found_by=row.get("steps_found_by"),
                step_confidence=row.get("step_confidence"), step_ms_p50=row.get("step_ms_p50"),
                calls=prof.get("calls"))
    compare(case)
    if case["steps_found"] is not None and case["tokens_generated"] is not None:
        case["steps_within_1"] = abs(case["steps_found"] - case["tokens_generated"]) <= 1
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "profile_any_loop.json"))
    parser.add_argument("--work", default=str(ROOT / "bubblescope-profile-any-loop"), help="outputs of each run")
    parser.add_argument("--timeout", type=float, default=420, help="seconds per command")
    parser.add_argument("--skip", type=int, default=10, help="profile --skip")
    parser.add_argument("--steps", type=int, default=40, help="profile --steps (the window)")
    parser.add_argument("--smoke", action="store_true", help="tiny models on a CPU: the plumbing only")
    args = parser.parse_args()
    global MODEL, PROMPT, NEW
    extra: dict = {}
    if args.smoke:
        MODEL, PROMPT, NEW, extra = SMOKE["model"], SMOKE["prompt"], SMOKE["new"], SMOKE["args"]
        args.skip, args.steps = SMOKE["skip"], SMOKE["steps"]
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := [c for c in names if c not in CASES]:
        parser.error(f"--cases: unknown {', '.join(unknown)}; use {', '.join(CASES)}")
    if args.skip + 1 + 2 * args.steps > NEW:
        parser.error(f"--skip + 1 + 2 × --steps must fit the {NEW} generated tokens (the window and as many steps "
                     "timed without the profiler)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path = Path(args.out)
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc.update(device=_device(), date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               commit=_commit(), versions=_versions(), model=MODEL, prompt_len=PROMPT, new_tokens=NEW,
               skip=args.skip, steps=args.steps, smoke=args.smoke)
    if "diagnose" in names:
        diag = run_diagnose(work, args.timeout)
        doc["diagnose"] = diag
        doc["trace_check"] = diag["trace_check"]
    util_dm = (doc.get("diagnose") or {}).get("util") or {}
    cases = {c["name"]: c for c in doc.get("cases", [])}
    for name in names:
        if name != "diagnose":
            cases[name] = run_case(name, work, args.timeout, args.skip, args.steps, util_dm, extra.get(name))
            print(json.dumps({k: cases[name].get(k) for k in ("name", "steps_found", "tokens_generated",
                                                                  "util_profile", "util_diagnose_model",
                                                                  "profiler_overhead_pct")}), flush=True)
    for case in cases.values():  # a diagnose run after the cases: their comparison is refreshed
        engine = case.get("util_diagnose_model_engine")
        if engine in util_dm:
            case["util_diagnose_model"] = util_dm[engine]
            compare(case)
    doc["cases"] = [cases[n] for n in CASES if n in cases]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
