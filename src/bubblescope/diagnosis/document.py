"""The results document of a ``diagnose`` run before any engine is measured: provenance, the device, the model and
the workload (docs/results-schema.md), with the notes a reader needs when the measured model or device is not what
they may assume."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys

import torch

from ..version import __version__
from .plan import CPU_DEFAULT_MODEL, CPU_FALLBACK_MODEL, RunPlan


def command_line() -> str:
    """The command as typed (for the results' provenance)."""
    return " ".join(["bubblescope"] + sys.argv[1:])


def model_notes(requested: str | None, model: str, source: str, dev: torch.device,
                checkpoint: str | None = None) -> list[str]:
    """Plain-words notes when the measured model is not what a user may assume: a default chosen for them
    (neither MODEL nor ``checkpoint`` given), a missing weights file replaced by another model or by seeded
    dummy weights (text is then meaningless; timings and bytes are those of the real shapes)."""
    from ..models.loader import KNOWN_FILES, model_search_dirs

    searched = ", ".join(str(d) for d in model_search_dirs())
    notes = []
    if requested is None and checkpoint is None:
        if dev.type == "cpu" and model == CPU_FALLBACK_MODEL:
            notes.append(f"model: none given and {CPU_DEFAULT_MODEL}'s weights file was not found (searched "
                         f"{searched}; set BUBBLESCOPE_MODELS or pass MODEL), so the {CPU_FALLBACK_MODEL} preset "
                         "with seeded dummy weights was measured")
        else:
            notes.append(f"model: none given; measured the default {model} for a {dev.type.upper()} run")
    if source == "dummy":
        if model.lower() in KNOWN_FILES and requested is not None:
            notes.append(f"model: {model}'s weights file was not found (searched {searched}), so seeded dummy "
                         "weights of its config were measured")
        elif not (requested is None and model == CPU_FALLBACK_MODEL):
            notes.append(f"model: {model} ran with seeded dummy weights (real shapes and bytes, meaningless text)")
    return notes


def threads() -> dict:
    """The CPU threads this run had: torch's intra-op threads, ``$OMP_NUM_THREADS`` as set (None: unset) and the
    machine's cores (for the findings' thread advice, which must not ask for what is set already)."""
    return {"torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_count": os.cpu_count()}


def versions(dev_info: dict) -> dict:
    """The ``versions`` section: bubblescope, Python, torch and transformers as imported here; Triton, CUDA and
    the driver as ``dev_info`` (:func:`~bubblescope.profiler.hardware.device_info`) read them (None: absent)."""
    try:
        import transformers
        tf = transformers.__version__
    except ImportError:
        tf = None
    return {"bubblescope": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "triton": dev_info.get("triton_version"), "transformers": tf, "cuda": dev_info.get("cuda_version"),
            "driver": dev_info.get("driver_version")}


def new_document(plan: RunPlan, loaded, auto: dict | None) -> dict:
    """The results document of ``plan`` over ``loaded`` (a :class:`~bubblescope.models.LoadedModel`) with no
    engine measured yet: ``engines`` and ``findings`` empty. Reads the device (NVML on a GPU) and, on a GPU,
    measures the device-to-device copy bandwidth (GB/s) once for every engine's ``util_copy``. ``auto``: what
    ``--engines auto`` chose (``{"engine", "reason"}``), said in the device notes; None without it."""
    from ..profiler.hardware import device_info, measure_copy_bandwidth
    from ..reports.results import SCHEMA

    dev, cfg, model = plan.device, loaded.config, plan.model
    info = device_info(dev if plan.on_gpu else "cpu")
    copy = measure_copy_bandwidth(dev) if plan.on_gpu else {"copy_GBps": None, "reason": "CPU run"}
    notes = (model_notes(plan.requested_model, model, loaded.source, dev, plan.checkpoint) + loaded.warnings
             + list(info.get("notes") or []))
    if plan.tuning is not None and (unchecked := plan.tuning.check_model(cfg)):
        notes.append(unchecked)
    if not plan.on_gpu:
        notes.append("CPU only: no GPU on this machine, so GPU timeline and bandwidth metrics are unavailable")
    if copy.get("reason") and plan.on_gpu:
        notes.append(f"copy bandwidth not measured: {copy['reason']}")
    if auto:
        notes.append(f"--engines auto: {auto['engine']} ({auto['reason']})")
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": plan.command or "bubblescope.diagnose(...)",
        "versions": versions(info),
        "device": {"type": dev.type, "name": info.get("name"), "sm_count": info.get("sm_count"),
                   "l2_bytes": info.get("l2_bytes"), "nvml_peak_GBps": info.get("nvml_peak_GBps"),
                   "copy_GBps": copy.get("copy_GBps"), "max_sm_clock_MHz": info.get("max_sm_clock_MHz"),
                   "max_mem_clock_MHz": info.get("max_mem_clock_MHz"),
                   "bus_width_bits": info.get("bus_width_bits"), "notes": notes, "threads": threads()},
        "model": {"name": cfg.name if loaded.source != "dummy" or model.lower() != cfg.name else model,
                  "source": loaded.source, "path": loaded.path, "parameters": cfg.num_parameters(),
                  "weight_bytes": loaded.weights.nbytes(), "dtype": plan.dtype_name,
                  "weights": loaded.weights.weight_format, "config": cfg.to_hf_dict()},
        "workload": plan.workload.record(),
        "engines": [],
        "findings": [],
    }
