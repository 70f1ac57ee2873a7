"""The tables a trace is read into: which events each keeps, its columns and their types.

Four tables (:data:`TABLE_COLUMNS`): ``gpu`` (GPU activities: complete events of a kernel, memcpy or memset
category), ``runtime`` (CUDA runtime/driver API calls on the CPU), ``annotations`` (``record_function``
ranges) and ``flows`` (flow events). Int columns hold int64 with :data:`NA` for "absent"; times are float64
µs once read (exact ints or ns on the way, see :mod:`.columns`); texts are int32 codes into one vocabulary.
"""

from __future__ import annotations

# Chrome-trace category -> activity kind. Old Kineto wrote the capitalised names.
GPU_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "Driver"})
# torch's legacy autograd profiler (torch.autograd.profiler ``EventList.export_chrome_trace``, torch 1.x with
# use_cuda=True) writes complete events without a category: operators on pid "CPU functions" (tid the thread),
# kernels on pid "CUDA functions" with tid the device index, linked to their operator only by flow events. Its
# kernels are GPU kernels (device = tid, stream unknown); it records no launch call.
LEGACY_GPU_PID = "CUDA functions"
LEGACY_KERNELS = ("kernels of a legacy autograd-profiler export (pid 'CUDA functions', no category) read as GPU "
                  "kernels of device tid, stream unknown; that format records no launch calls, so launch and "
                  "per-step figures are unavailable (a torch.profiler trace has them)")
FLOW_PHASES = frozenset({"s", "t", "f"})
# Every phase of the Trace Event Format (duration B/E, complete X, instant i/I, counter C, async b/n/e and the
# deprecated S/T/p/F, flow s/t/f, sample P, object N/O/D, metadata M, memory dump V/v, mark R, clock sync c,
# context ( and ), linked id =). An event of another phase (or none) is ignored, as viewers do, and counted.
PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()=")
UNKNOWN_PHASE = "events of an unknown phase (ph) ignored"
NA = -(1 << 63)  # int64 sentinel for "absent" in int columns
# |ts| or dur beyond this (2^63 µs) is corrupt: spans and sums of such times overflow float64 to inf.
MAX_TIME_US = float(1 << 63)
# Beyond 2^53 µs (~285 years after 1970 in µs; ns written as µs reach ~1.7e18) float64 cannot hold every integer
# µs: integer ts are then rebased onto the trace's smallest one before they become floats (columns.rebase_times).
EXACT_US = 1 << 53
# Beyond 2^43 µs (~8.8e12: Kineto's absolute epoch times are ~1.7e15) float64's spacing exceeds 1 ns, so the three
# decimals of ns that Kineto writes after the µs are lost. Such ts are read from their text, exactly, as int64 ns
# (numpy timedelta64[ns] columns) and rebased onto the trace's first µs before they become floats
# (columns.rebase_times).
NS_EXACT_US = 1 << 43
# Where an int column's values come from, as the warnings name it (others: pid, tid, or args.<column>); a GPU
# activity's device and stream fall back on its pid and tid when args has none.
INT_LABELS = {("flows", "id"): "flow id", ("gpu", "device"): "args.device (or pid)",
              ("gpu", "stream"): "args.stream (or tid)"}
# What an int that is not one becomes, as the warnings say it; by default null. The GPU table's unknown device is
# -1 (columns.build_arrays), which the reports show.
INT_NULL_SHOWN = {"args.device (or pid)": "-1 (device unknown)"}

_GPU_COLUMNS = (
    "name",
    "kind",
    "device",
    "stream",
    "ts_us",
    "dur_us",
    "correlation",
    "external_id",
    "grid",
    "block",
    "registers_per_thread",
    "shared_memory_bytes",
    "blocks_per_sm",
    "warps_per_sm",
    "occupancy_pct",
)
_RUNTIME_COLUMNS = ("name", "category", "pid", "tid", "ts_us", "dur_us", "correlation", "external_id")
_ANNOTATION_COLUMNS = ("name", "pid", "tid", "ts_us", "dur_us")
_FLOW_COLUMNS = ("id", "phase", "ts_us", "pid", "tid", "cat")
INT_COLUMNS = frozenset({"device", "stream", "correlation", "external_id", "pid", "tid", "id"})
FLOAT_COLUMNS = frozenset({"ts_us", "dur_us", *_GPU_COLUMNS[10:]})
# Complete-event category -> the table it goes to (a GPU kind, "runtime" or "annotation").
X_TABLES = {**GPU_KINDS, **{c: "runtime" for c in RUNTIME_CATEGORIES}, "user_annotation": "annotation"}
TABLE_COLUMNS = {"gpu": _GPU_COLUMNS, "runtime": _RUNTIME_COLUMNS, "annotations": _ANNOTATION_COLUMNS,
                 "flows": _FLOW_COLUMNS}
# What a summary never reads (load_trace(lean=True) leaves it out): launch ids and kernel shapes.
_LEAN_DROPPED = frozenset({"external_id", "grid", "block", "shared_memory_bytes", "blocks_per_sm", "warps_per_sm",
                           "occupancy_pct"})
LEAN_COLUMNS = {t: tuple(c for c in cols if c not in _LEAN_DROPPED) for t, cols in TABLE_COLUMNS.items()}
