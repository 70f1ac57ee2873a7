"""``diagnose model MODEL --tp N``, the CLI's side: check the options, then start the ranks through torchrun.

:func:`tp_options` maps ``diagnose model``'s options onto :func:`~bubblescope.tpdiagnose.tp_diagnose`'s
arguments and refuses, by name, those the tensor-parallel run cannot honour (``--counters``, ``--tuning``,
``--context-sweep``, ``--device cuda:N``, engines other than the reference), never dropping one silently.
:func:`launch_tp` checks what it can before any process starts (:func:`check_split`, the workload sizes, the
output folder, the dtype), runs ``python -m torch.distributed.run --standalone --nproc-per-node N -m
bubblescope.tpdiagnose '<json kwargs>'`` and turns a rank's bad-input error into one ``error:`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import BubblescopeError

MODES = {"reference": "eager", "reference-cudagraph": "cudagraph"}  # --engines -> TPReferenceEngine mode


def check_split(model: str | None, checkpoint: str | None, world_size: int) -> None:
    """Refuse, before any process starts, a preset or Hugging Face config that does not split over
    ``world_size`` ranks (other sources are checked by the ranks).

    Raises:
        BubblescopeError: as ``ModelConfig.tp_shard``.
    """
    from .models.config import PRESETS, ModelConfig

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise BubblescopeError(f"--tp: must be an integer >= 1, got {world_size!r}")
    path = Path(checkpoint or model or "")
    if checkpoint is None and model and model.lower() in PRESETS:
        PRESETS[model.lower()].tp_shard(world_size)
    elif path.is_dir() and (path / "config.json").is_file() or path.suffix == ".json" and path.is_file():
        ModelConfig.from_hf_config(path).tp_shard(world_size)


def tp_options(engines: str | None = None, context_sweep: str | None = None, device: str | None = None,
               tuning: str | os.PathLike | None = None, counters: bool = False, prefill: str | None = None,
               **kwargs) -> dict:
    """Map ``diagnose model``'s options onto :func:`tp_diagnose`'s keyword arguments (``kwargs`` pass through),
    refusing those the tensor-parallel run cannot honour rather than dropping them.

    ``engines``: reference (eager) or reference-cudagraph (the TP engine's modes). ``device``: cpu or cuda
    (each rank then takes GPU LOCAL_RANK, so no index). ``context_sweep``: only none/empty.

    Raises:
        BubblescopeError: one line naming the option: another engine, a context sweep, ``--tuning`` (it tunes
            megakernel engines), ``--counters`` (Nsight Compute profiles one process), ``--prefill stepwise`` (the
            megakernel's ablation), ``--device cuda:N`` or a device this machine lacks.
    """
    from .models import resolve_device

    mode = MODES.get(engines) if engines else None
    if engines and mode is None:
        raise BubblescopeError(f"--engines with --tp: one of {', '.join(MODES)}, got {engines!r}")
    if context_sweep not in (None, "", "none"):
        raise BubblescopeError("--context-sweep: not supported with --tp (the tensor-parallel run times the "
                               "prompt + generated context only); leave it out")
    if tuning is not None:
        raise BubblescopeError("--tuning: not supported with --tp (tuned files set megakernel engines; --tp runs "
                               "the reference engine)")
    if counters:
        raise BubblescopeError("--counters: not supported with --tp (Nsight Compute profiles one process); run "
                               "without --tp to read hardware counters")
    from .engines import check_prefill
    check_prefill(prefill)  # an unknown mode
    if prefill == "stepwise":
        raise BubblescopeError("--prefill stepwise: not supported with --tp (token-by-token prefill is the megakernel "
                               "engines' ablation; --tp runs the reference engine, which prefills in one forward)")
    device = None if device in (None, "auto") else device
    if device is not None:
        dev = resolve_device(device)  # a bad name, cpu:N or a missing GPU raise here
        if dev.index is not None:
            raise BubblescopeError(f"--device {device}: with --tp each rank uses GPU LOCAL_RANK; give cuda or cpu")
        device = dev.type
    return {**kwargs, "mode": mode, "device": device}


ERROR_FILE_ENV = "BUBBLESCOPE_TP_ERROR_FILE"  # where a rank leaves its one-line error for launch_tp


def launch_tp(world_size: int, **kwargs) -> int:
    """Run :func:`tp_diagnose` on ``world_size`` local ranks through torchrun; return 0, or 2 when a rank failed.

    torchrun's stderr is held back and shown only on success, or on a failure without a rank's one-line error:
    a bad input found by a rank is one ``error:`` line, not torchrun's failure report.

    Raises:
        BubblescopeError: the model does not split over ``world_size`` ranks (:func:`check_split`), a
            workload size is too small (:func:`~bubblescope.diagnosis.plan.check_workload`), ``out`` cannot be
            created (:func:`~bubblescope.outdir.check_out_dir`), an unknown dtype.
    """
    from .diagnosis.plan import check_workload
    from .models import parse_dtype
    from .outdir import check_out_dir

    # Checked here too, before any process starts: a rank's error would come back as a failed torchrun.
    check_workload(**{k: kwargs.get(k) for k in ("prompt_len", "gen_len", "runs", "warmup", "profile_steps")})
    check_split(kwargs.get("model"), kwargs.get("checkpoint"), world_size)
    check_out_dir(kwargs.get("out", "bubblescope-out"))
    if kwargs.get("dtype") is not None:
        parse_dtype(kwargs["dtype"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "-m", "bubblescope.tpdiagnose", json.dumps(kwargs)]
    with tempfile.TemporaryDirectory(prefix="bubblescope-tp-") as tmp:
        error_file = Path(tmp) / "error.txt"
        proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, errors="replace",
                              env={**os.environ, ERROR_FILE_ENV: str(error_file)})
        rank_error = error_file.read_text().strip() if error_file.is_file() else ""
    if proc.returncode and rank_error:
        print(f"error: {rank_error}", file=sys.stderr)
        return 2
    sys.stderr.write(proc.stderr)
    if proc.returncode:
        print(f"error: tensor-parallel run failed (torchrun exit {proc.returncode}); the ranks' messages are above",
              file=sys.stderr)
        return 2
    return 0
