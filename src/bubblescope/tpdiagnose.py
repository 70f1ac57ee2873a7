"""``diagnose model MODEL --tp N``: the tensor-parallel reference engine measured on every rank, merged on rank 0.

:func:`~bubblescope.tplaunch.launch_tp` (the CLI's side) checks the options, then runs
``python -m torch.distributed.run --standalone --nproc-per-node N -m bubblescope.tpdiagnose '<json kwargs>'``
(``torchrun``'s single-host rendezvous; for several nodes, start the same module with torchrun's usual
``--nnodes``/``--rdzv-endpoint`` options). Every rank then runs :func:`tp_diagnose`: it loads the model, keeps
its shard, times greedy generation and records its own trace (``traces/<engine>-rank<r>.json.gz``, Kineto writes
the rank into ``distributedInfo``). Rank 0 merges the traces (:mod:`.profiler.trace.ranksummary`), adds the per-rank
bytes per step and collectives (:func:`.profiler.traffic.rank_step_traffic`) and the findings, and writes
``tp.json`` (schema ``bubblescope.tp/1``) and, on GPUs, ``ranks_timeline.png`` (the ranks' first steps on one
axis). As in the single-process run, everything goes into a staging folder inside ``out`` (rank 0 makes it
and tells the others its path) and is published at the end (:class:`~bubblescope.outdir.RunFolder`): a failed
or interrupted run leaves ``out`` as it was. The library call works inside any torchrun job.

``diagnose model``'s options that this path cannot honour are refused by
:func:`~bubblescope.tplaunch.tp_options` before any process starts, never silently dropped.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

from .errors import BubblescopeError, path_error

SCHEMA = "bubblescope.tp/1"
BACKENDS = {None: None, "cpu": "gloo", "cuda": "nccl"}  # --device -> process-group backend (None: by CUDA)


PROFILER_SKEW_STEPS = 1  # profiled steps left out of the cross-rank comparison (see tp_diagnose)

def _atomic_json(path: Path, doc: dict) -> None:
    """``doc`` as indented JSON at ``path``, whole or not at all (OutputNotWritten on a full disk)."""
    from .outdir import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(doc, indent=2, allow_nan=False).encode())


def _comm(section: dict | None, traffic: dict, peak_GBps: float | None) -> dict:
    """The ``tp`` entry: collectives per step, the NCCL time of the rank that waited least, the bound."""
    from .profiler.traffic import bound_by

    out = {k: traffic[k] for k in ("world_size", "allreduce_count", "allreduce_bytes", "allgather_bytes", "bus_bytes")}
    out["rank_bytes_per_step"] = traffic["total_bytes"]
    nccl = None
    rows = (section or {}).get("rank_steps") or []
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r.get("nccl_us") is not None:
            by_step.setdefault(r["step"], []).append(r["nccl_us"])
    if by_step:  # per step the least NCCL time over ranks is the closest to pure communication (no waiting)
        nccl = statistics.median(min(v) for v in by_step.values())
    out["nccl_us_per_step"] = nccl
    out["nccl_share"] = ((section or {}).get("median") or {}).get("nccl_share")
    out["bus_GBps"] = traffic["bus_bytes"] / nccl / 1e3 if nccl else None
    out.update({k: v for k, v in bound_by(traffic["total_bytes"], peak_GBps, nccl).items() if k != "nccl_us"})
    return out


def _timeline_png(traces: list, path: Path) -> str | None:
    """Draw the ranks' first steps on one axis into ``path`` (atomically); its name, or None if nothing to draw."""
    from .profiler.capture import STEP_MARKER
    from .profiler.trace.ranks import rank_activities, rank_steps
    from .reports.rank_plots import rank_timeline_figure

    fig = rank_timeline_figure(rank_activities(traces, rank_steps(traces, STEP_MARKER)))
    if fig is None:
        return None
    from .outdir import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())
    return path.name


def tp_diagnose(model: str | None = None, checkpoint: str | None = None, mode: str | None = None,
                prompt_len: int | None = None, gen_len: int | None = None, runs: int = 3, profile_steps: int = 8,
                dtype: str | None = None, out: str | Path = "bubblescope-out", seed: int = 0,
                command: str | None = None, warmup: int = 1, device: str | None = None) -> dict | None:
    """Measure the tensor-parallel reference engine on this rank; on rank 0 return (and write) the merged doc.

    Call on every rank of an initialized (or torchrun-described) process group. ``mode``: eager or cudagraph
    (default: cudagraph on GPUs, eager on CPU). Defaults as ``diagnose``: prompt 128 / 16 and 128 / 32 new
    tokens on GPU / CPU; ``warmup`` untimed generations of ``gen_len`` tokens before the ``runs`` timed ones.
    ``device``: cpu (gloo) or cuda (NCCL, GPU LOCAL_RANK); None: cuda when available; it only picks the
    backend of a process group that is not initialized yet. Returns None on ranks other than 0.

    Raises:
        BubblescopeError: a model that does not split over the ranks, a workload beyond its positions, bad options,
            an ``out`` that cannot be created.
    """
    import torch.distributed as dist

    from .diagnosis.plan import check_workload
    from .reference_engine.tp import init_distributed

    if device not in BACKENDS:
        raise BubblescopeError(f"--device {device}: with --tp, cpu (gloo) or cuda (NCCL, each rank on GPU LOCAL_RANK)")
    rank, world, dev = init_distributed(BACKENDS[device])
    mode = mode or ("cudagraph" if dev.type == "cuda" else "eager")
    check_workload(prompt_len=prompt_len, gen_len=gen_len, runs=runs, warmup=warmup, profile_steps=profile_steps)
    with _staged(out, rank) as (folder, stage):
        doc = _measure_and_merge(rank, world, dev, stage, model=model, checkpoint=checkpoint, mode=mode,
                                 prompt_len=prompt_len, gen_len=gen_len, runs=runs, warmup=warmup,
                                 profile_steps=profile_steps, dtype=dtype, seed=seed, command=command)
        if folder is not None:
            folder.publish()
    dist.barrier()
    return doc


@contextmanager
def _staged(out: str | Path, rank: int):
    """Yield ``(RunFolder or None, staging path)`` on every rank: rank 0 makes the folder inside ``out`` and
    broadcasts its path (or its error, so every rank raises instead of waiting for a path that never comes)."""
    import torch.distributed as dist

    from .outdir import RunFolder

    folder, box = None, [None]
    if rank == 0:
        try:
            folder = RunFolder(out)
            box = [("stage", str(folder.stage))]
        except BubblescopeError as e:
            box = [("error", str(e))]
        except OSError as e:  # a path the user named (too long, no permission, ...)
            if (message := path_error(e)) is None:
                raise
            box = [("error", message)]
    dist.broadcast_object_list(box, src=0)
    kind, text = box[0]
    if kind == "error":
        raise BubblescopeError(text)
    if folder is None:
        yield None, Path(text)
        return
    with folder:
        yield folder, folder.stage


def _measure_and_merge(rank: int, world: int, dev, out: Path, *, model, checkpoint, mode, prompt_len, gen_len,
                       runs, warmup, profile_steps, dtype, seed, command) -> dict | None:
    """Load, time and trace on this rank (into ``out``, the staging folder); on rank 0 merge and write tp.json."""
    import torch
    import torch.distributed as dist

    from .diagnosis.measure import latency_stats
    from .diagnosis.plan import check_positions, default_model, workload_lengths
    from .generation import generate, random_ids
    from .models import load_model, run_dtype
    from .profiler.capture import STEP_MARKER, capture_decode_trace
    from .profiler.hardware import device_info
    from .profiler.trace.ranksummary import multirank_section
    from .profiler.trace import load_trace
    from .profiler.traffic import bandwidth, rank_step_traffic
    from .reference_engine.tp import TPReferenceEngine
    from .reports.findings import find

    on_gpu = dev.type == "cuda"
    prompt_len, gen_len = workload_lengths(prompt_len, gen_len, dev)
    model = model or default_model(dev, checkpoint)
    tdtype = run_dtype(dtype, dev)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, dtype=tdtype, seed=seed)
    cfg = loaded.config
    need = check_positions(cfg, prompt_len, gen_len, profile_steps, extra_steps=PROFILER_SKEW_STEPS)
    engine = TPReferenceEngine(loaded.weights, mode=mode, max_seq_len=need)
    source, weight_bytes = loaded.source, loaded.weights.nbytes()
    del loaded  # the full weights: each rank keeps only its shard
    prompt = random_ids(cfg.vocab_size, prompt_len, torch.Generator().manual_seed(seed))
    for _ in range(warmup):  # graph capture, allocator
        generate(engine, prompt, gen_len, eos_ids=())
    token_ms, ttft, shares = [], [], []
    for _ in range(runs):
        res = generate(engine, prompt, gen_len, eos_ids=())
        token_ms += res.token_ms
        ttft.append(res.ttft_ms)
        if res.decode_share is not None:
            shares.append(res.decode_share)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    # One extra step, left out of the cross-rank section: the ranks start their profilers one after the other,
    # so the first profiled step's collectives absorb that start-up difference (a 95 ms start skew on two H200s,
    # 2026-12-01), which is the tool's, not the engine's.
    cap = capture_decode_trace(engine, prompt, steps=profile_steps + PROFILER_SKEW_STEPS, warmup=3,
                               out_path=out / "traces" / f"{engine.name}-rank{rank}.json.gz",
                               profiled_warmup=PROFILER_SKEW_STEPS)
    dist.barrier()  # every rank's trace is on disk
    doc = None
    if rank == 0:
        paths = [out / "traces" / f"{engine.name}-rank{r}.json.gz" for r in range(world)]
        traces = [load_trace(p) for p in paths]
        section = multirank_section(traces, STEP_MARKER, skip_steps=PROFILER_SKEW_STEPS) if cap.gpu else None
        plot = _timeline_png(traces, out / "ranks_timeline.png") if cap.gpu else None
        info = device_info(dev) if on_gpu else {}
        peak = info.get("nvml_peak_GBps")
        context = prompt_len + gen_len // 2
        traffic = rank_step_traffic(cfg, tdtype.itemsize, context, world)
        lat = latency_stats(token_ms, ttft, shares)
        entry = {"name": engine.name, "status": "ok", "latency": lat,
                 "bandwidth": {"rank_bytes_per_step": traffic["total_bytes"], "context": context,
                               **bandwidth(traffic["total_bytes"], lat["token_ms_p50"], peak)},
                 "tp": _comm(section, traffic, peak), "trace_paths": [str(p.relative_to(out)) for p in paths],
                 "timeline_png": plot}
        doc = {"schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "command": command or "bubblescope.tpdiagnose.tp_diagnose(...)", "world_size": world,
               "device": {"type": dev.type, "name": info.get("name"), "nvml_peak_GBps": peak,
                          "backend": dist.get_backend()},
               "model": {"name": cfg.name, "source": source, "weight_bytes": weight_bytes,
                         "dtype": str(tdtype).replace("torch.", "")},
               "workload": {"prompt_len": prompt_len, "gen_len": gen_len, "runs": runs, "warmup": warmup,
                            "seed": seed, "profile_steps": profile_steps, "mode": mode},
               "engines": [entry], "ranks": section,
               "notes": [] if cap.gpu else ["CPU only: no GPU activity, so NCCL share, skew and the bound are "
                                            "unavailable"]}
        doc["findings"] = find(doc)
        _atomic_json(out / "tp.json", doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Rank entry point: ``python -m bubblescope.tpdiagnose '<json kwargs of tp_diagnose, plus "format": text|json>'``;
    rank 0 prints the merged document in that format."""
    args = json.loads((argv or sys.argv[1:])[0])
    fmt = args.pop("format", "text")
    try:
        try:
            doc = tp_diagnose(**args)
        except OSError as e:  # a path the user named (too long, no permission, ...): bad input, as in the CLI
            message = path_error(e)
            if message is None:
                raise
            raise BubblescopeError(message) from None
    except BubblescopeError as e:
        from .tplaunch import ERROR_FILE_ENV

        error_file = os.environ.get(ERROR_FILE_ENV)
        if error_file:  # launch_tp shows it once; the first rank to fail writes it (every rank may raise)
            try:
                with open(error_file, "x") as fh:
                    fh.write(str(e))
            except FileExistsError:
                pass
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if doc is not None and fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    elif doc is not None:
        from rich.console import Console

        from .reports.tp_terminal import render_tp
        render_tp(doc, Console())
        print(f"wrote {Path(args.get('out', 'bubblescope-out')) / 'tp.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
