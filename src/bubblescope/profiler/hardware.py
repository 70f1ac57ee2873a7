"""Hardware ceilings: what the device is, its NVML peak and measured copy bandwidth, and NVML sampling.

NVML is reached through the ``pynvml`` module of nvidia-ml-py; torch and pynvml are imported inside the
functions, so importing this module costs nothing. Wherever NVML is missing, fails, or refuses a query
(MIG instances refuse many), the value is ``None`` and a note says why: a description with holes beats
an exception in a diagnosis tool.
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from contextlib import suppress
from importlib import metadata

from ..errors import BubblescopeError
from ..wording import count as plural_count

_GIB = 1 << 30


def nvml_peak_GBps(bus_width_bits: int | None, max_mem_clock_MHz: float | None) -> float | None:
    """Theoretical peak memory bandwidth in GB/s (10^9 bytes per second).

    ``bus_width_bits / 8 × max_mem_clock_MHz × 10^6 × 2 / 10^9``: bytes per transfer times transfers per
    second, two per clock (double data rate; NVML's HBM memory clock counts that way too). Inputs are
    NVML's ``nvmlDeviceGetMemoryBusWidth`` (bits) and ``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`` (MHz);
    the H200 reports 6016 bits and 3201 MHz -> 4814 GB/s. Returns ``None`` when either input is ``None``.

    Raises:
        BubblescopeError: an input is zero or negative.
    """
    if bus_width_bits is None or max_mem_clock_MHz is None:
        return None
    if bus_width_bits <= 0 or max_mem_clock_MHz <= 0:
        raise BubblescopeError(
            f"NVML peak bandwidth: bus width {bus_width_bits} bits and memory clock {max_mem_clock_MHz} MHz "
            "must both be positive")
    return bus_width_bits / 8 * max_mem_clock_MHz * 1e6 * 2 / 1e9


def _parse_device(device):
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        first = (str(e).splitlines() or [""])[0]
        raise BubblescopeError(f"device {device!r}: not a device name ({first})") from None
    if dev.type not in ("cuda", "cpu"):
        raise BubblescopeError(f"device {device!r}: only cuda and cpu devices are supported")
    return dev


def _dist_version(name: str) -> str | None:
    # Package metadata, not an import: importing triton just for its version costs a second.
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _import_pynvml(notes: list[str]):
    try:
        import pynvml
    except ImportError:
        notes.append("nvidia-ml-py (pynvml) is not installed: NVML values are None")
        return None
    return pynvml


def _nvml_handle(nv, cuda_index: int, uuid, notes: list[str]):
    """NVML handle of the CUDA device ``cuda_index``, matched by UUID because CUDA_VISIBLE_DEVICES
    renumbers CUDA devices but not NVML's."""
    if uuid is not None:
        s = str(uuid)
        # torch prints the bare 8-4-4-4-12 UUID; NVML wants its "GPU-" (or "MIG-") prefix.
        if not s.startswith(("GPU-", "MIG-")):
            s = "GPU-" + s
        with suppress(nv.NVMLError):
            return nv.nvmlDeviceGetHandleByUUID(s)
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(cuda_index)
    except nv.NVMLError as e:
        notes.append(f"NVML has no device {cuda_index} ({e}): NVML values are None")
        return None
    if uuid is not None:
        notes.append(f"NVML did not recognise the CUDA device's UUID; using NVML device {cuda_index} "
                     "(wrong if CUDA_VISIBLE_DEVICES reorders devices)")
    return handle


def _nvml_query(nv, notes: list[str], what: str, fn, *args):
    try:
        value = fn(*args)
    except nv.NVMLError as e:
        notes.append(f"NVML {what}: {e}; value is None")
        return None
    return value.decode() if isinstance(value, bytes) else value


def _nvml_fields(cuda_index: int, uuid, notes: list[str]) -> dict:
    nv = _import_pynvml(notes)
    if nv is None:
        return {}
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        notes.append(f"NVML unavailable ({e}): NVML values are None")
        return {}
    try:
        handle = _nvml_handle(nv, cuda_index, uuid, notes)
        if handle is None:
            return {}
        out = {"driver_version": _nvml_query(nv, notes, "driver version", nv.nvmlSystemGetDriverVersion)}
        try:
            out["mig"] = nv.nvmlDeviceGetMigMode(handle)[0] == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError as e:
            # GPUs without MIG support answer NotSupported: that means "no MIG", not "unknown".
            out["mig"] = False if e.value == nv.NVML_ERROR_NOT_SUPPORTED else None
            if out["mig"] is None:
                notes.append(f"NVML MIG mode: {e}; value is None")
        out["bus_width_bits"] = _nvml_query(nv, notes, "memory bus width", nv.nvmlDeviceGetMemoryBusWidth, handle)
        out["max_mem_clock_MHz"] = _nvml_query(nv, notes, "max memory clock", nv.nvmlDeviceGetMaxClockInfo,
                                               handle, nv.NVML_CLOCK_MEM)
        out["max_sm_clock_MHz"] = _nvml_query(nv, notes, "max SM clock", nv.nvmlDeviceGetMaxClockInfo,
                                              handle, nv.NVML_CLOCK_SM)
        return out
    finally:
        with suppress(nv.NVMLError):
            nv.nvmlShutdown()


def local_gpus() -> tuple[list[dict], str | None]:
    """This machine's GPUs as NVML sees them, without torch: ``([{"name", "memory_bytes", "nvml_peak_GBps"}],
    None)``, or ``([], why not)`` when NVML is missing or fails. ``nvml_peak_GBps`` is :func:`nvml_peak_GBps`
    of the device's bus width and max memory clock (None where NVML refuses a query)."""
    notes: list[str] = []
    nv = _import_pynvml(notes)
    if nv is None:
        return [], notes[0]
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        return [], f"NVML unavailable ({e})"
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            memory = _nvml_query(nv, notes, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
            bus = _nvml_query(nv, notes, "memory bus width", nv.nvmlDeviceGetMemoryBusWidth, handle)
            clock = _nvml_query(nv, notes, "max memory clock", nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM)
            out.append({"name": _nvml_query(nv, notes, "name", nv.nvmlDeviceGetName, handle),
                        "memory_bytes": getattr(memory, "total", None),
                        "nvml_peak_GBps": nvml_peak_GBps(bus, clock) if bus and clock else None})
        return out, None
    except nv.NVMLError as e:
        return [], f"NVML: {e}"
    finally:
        with suppress(nv.NVMLError):
            nv.nvmlShutdown()


def device_info(device="cuda:0") -> dict:
    """Describe a device: identity, sizes, NVML peak bandwidth and software versions.

    Returns a dict with keys ``name``, ``type`` ("cuda" or "cpu"), ``index``, ``sm_count``, ``l2_bytes``,
    ``total_memory_bytes``, ``bus_width_bits``, ``max_mem_clock_MHz``, ``max_sm_clock_MHz``,
    ``nvml_peak_GBps`` (:func:`nvml_peak_GBps`), ``driver_version``, ``cuda_version`` (torch's CUDA
    runtime), ``torch_version``, ``triton_version``, ``cpu_count``, ``mig`` (bool, or None if unknown) and
    ``notes`` (list of one-line strings saying why a value is None or needs care). Sizes come from
    ``torch.cuda.get_device_properties``, the rest from NVML. A CUDA device requested where
    ``torch.cuda`` is unavailable gets the CPU description (name from ``platform``, GPU fields None)
    and a note; NVML failures leave their fields None with a note.

    Raises:
        BubblescopeError: ``device`` is not a cuda/cpu device name, or its index is out of range.
    """
    import torch

    dev = _parse_device(device)
    notes: list[str] = []
    info = dict.fromkeys(("name", "type", "index", "sm_count", "l2_bytes", "total_memory_bytes",
                          "bus_width_bits", "max_mem_clock_MHz", "max_sm_clock_MHz", "nvml_peak_GBps",
                          "driver_version", "cuda_version", "mig"))
    info.update(torch_version=torch.__version__, triton_version=_dist_version("triton"),
                cpu_count=os.cpu_count(), notes=notes)
    if dev.type == "cuda" and not torch.cuda.is_available():
        notes.append(f"{dev} requested but torch.cuda.is_available() is False: describing the CPU, GPU values are None")
        dev = torch.device("cpu")
    if dev.type == "cpu":
        info.update(name=platform.processor() or platform.machine() or "cpu", type="cpu")
        return info

    index = dev.index if dev.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise BubblescopeError(f"device {device!r}: index {index} is out of range "
                               f"({plural_count(count, 'CUDA device')} visible)")
    props = torch.cuda.get_device_properties(index)
    info.update(name=props.name, type="cuda", index=index, sm_count=props.multi_processor_count,
                l2_bytes=getattr(props, "L2_cache_size", None), total_memory_bytes=props.total_memory,
                cuda_version=torch.version.cuda)
    info.update(_nvml_fields(index, getattr(props, "uuid", None), notes))
    if "MIG-" in os.environ.get("CUDA_VISIBLE_DEVICES", ""):
        info["mig"] = True
    if info["mig"]:
        notes.append("MIG is on: the NVML peak is the whole GPU's; a MIG instance gets only its slice's bandwidth")
    info["nvml_peak_GBps"] = nvml_peak_GBps(info["bus_width_bits"], info["max_mem_clock_MHz"])
    return info


def measure_copy_bandwidth(device="cuda:0", nbytes: int | None = None, iters: int = 20, warmup: int = 3) -> dict:
    """Achievable HBM bandwidth: device-to-device copies of a buffer far larger than L2.

    Copies a ``uint8`` buffer of ``nbytes`` (default ``max(8 × L2 size, 1 GiB)``, so L2 cannot serve it)
    into a second one, ``warmup`` times untimed, then ``iters`` times, each timed with its own pair of
    CUDA events. ``copy_GBps`` = (bytes read + bytes written) / median time = ``2 × nbytes /
    median_ms / 10^6`` GB/s. The H200 measured 4.26 TB/s this way (NVML peak 4.81).

    Returns:
        ``{"copy_GBps": float, "samples_ms": list[float], "nbytes": int, "reason": None}``; on a CPU
        device or without CUDA the three values are None and ``reason`` says why (no exception).

    Raises:
        BubblescopeError: a bad device, ``nbytes`` or ``iters`` not positive, or two buffers of
            ``nbytes`` do not fit in the device's free memory.
    """
    import torch

    dev = _parse_device(device)
    for name, value, low in (("iters", iters, 1), ("warmup", warmup, 0), ("nbytes", nbytes, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise BubblescopeError(f"copy bandwidth: {name} must be an integer >= {low}, got {value!r}")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return {"copy_GBps": None, "samples_ms": None, "nbytes": None,
                "reason": f"no CUDA device for {dev} (torch.cuda.is_available() is {torch.cuda.is_available()})"}
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise BubblescopeError(f"device {device!r}: index {index} is out of range")
    dev = torch.device("cuda", index)
    if nbytes is None:
        nbytes = max(8 * getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0), _GIB)
    free, _ = torch.cuda.mem_get_info(index)
    if 2 * nbytes > free:
        raise BubblescopeError(f"copy bandwidth: two buffers of {nbytes} bytes do not fit in the {free} bytes "
                               f"free on {dev}; pass a smaller nbytes")
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    with torch.cuda.device(index):
        for _ in range(warmup):
            dst.copy_(src)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in pairs:
            start.record()
            dst.copy_(src)
            end.record()
        torch.cuda.synchronize(dev)
        samples = [start.elapsed_time(end) for start, end in pairs]
    del src, dst
    torch.cuda.empty_cache()  # hand the 2 × nbytes back before the model runs
    median_ms = statistics.median(samples)
    return {"copy_GBps": 2 * nbytes / median_ms / 1e6, "samples_ms": samples, "nbytes": nbytes, "reason": None}


class NvmlSampler:
    """Sample clocks, utilization, power and temperature in a background thread while a block runs.

    ``with NvmlSampler(0, interval_ms=20) as s: run()`` then ``s.frame()`` / ``s.summary()``.
    ``device_index`` is the CUDA index (matched to NVML by UUID when torch sees CUDA, else taken as the
    NVML index). One sample is a handful of NVML calls (tens of µs), taken every ``interval_ms``; the
    thread sleeps in between and so barely competes with the host loop for the GIL.

    Without NVML (not installed, no driver, no such device) nothing is sampled, ``available`` is False
    and ``reason`` says why. A single failed query (MIG instances refuse utilization, for example) gives
    NaN in that column and is counted in ``errors`` (column -> count).
    """

    COLUMNS = ("t_s", "sm_clock_MHz", "mem_clock_MHz", "gpu_util_pct", "mem_util_pct", "power_W", "temperature_C")

    def __init__(self, device_index: int = 0, interval_ms: float = 20.0):
        """Raises BubblescopeError: a negative ``device_index`` or a non-positive ``interval_ms``."""
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise BubblescopeError(f"NVML sampler: device_index must be an integer >= 0, got {device_index!r}")
        if not isinstance(interval_ms, (int, float)) or not interval_ms > 0:
            raise BubblescopeError(f"NVML sampler: interval_ms must be positive, got {interval_ms!r}")
        self.device_index = device_index
        self.interval_ms = float(interval_ms)
        self.available = False
        self.reason: str | None = None
        self.errors: dict[str, int] = {}
        self._rows: list[tuple] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = None
        self._handle = None

    def __enter__(self) -> "NvmlSampler":
        notes: list[str] = []
        self._rows, self.errors, self.available, self.reason = [], {}, False, None
        nv = _import_pynvml(notes)
        if nv is None:
            self.reason = notes[0]
            return self
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            self.reason = f"NVML unavailable ({e})"
            return self
        self._handle = _nvml_handle(nv, self.device_index, self._cuda_uuid(), notes)
        if self._handle is None:
            self.reason = notes[-1]
            with suppress(nv.NVMLError):
                nv.nvmlShutdown()
            return self
        self._nv, self.available = nv, True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bubblescope-nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nv is not None:
            with suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
            self._nv = None
        return False

    def _cuda_uuid(self):
        import torch

        if torch.cuda.is_available() and self.device_index < torch.cuda.device_count():
            return getattr(torch.cuda.get_device_properties(self.device_index), "uuid", None)
        return None

    def _read(self, column: str, fn, *args):
        try:
            return fn(*args)
        except self._nv.NVMLError:
            self.errors[column] = self.errors.get(column, 0) + 1
            return None

    def _sample(self, t0: float) -> tuple:
        nv, h = self._nv, self._handle
        util = self._read("gpu_util_pct", nv.nvmlDeviceGetUtilizationRates, h)
        if util is None:
            self.errors["mem_util_pct"] = self.errors.get("mem_util_pct", 0) + 1
        power_mW = self._read("power_W", nv.nvmlDeviceGetPowerUsage, h)
        return (time.perf_counter() - t0,
                self._read("sm_clock_MHz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                self._read("mem_clock_MHz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                None if util is None else util.gpu,
                None if util is None else util.memory,
                None if power_mW is None else power_mW / 1000.0,  # NVML reports milliwatts
                self._read("temperature_C", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU))

    def _run(self) -> None:
        t0 = time.perf_counter()
        while True:
            self._rows.append(self._sample(t0))
            if self._stop.wait(self.interval_ms / 1000.0):
                break

    def frame(self):
        """Samples as a DataFrame: ``t_s`` (s since start), ``sm_clock_MHz``, ``mem_clock_MHz``,
        ``gpu_util_pct``, ``mem_util_pct`` (0-100, NVML's share of the last sample period with a kernel
        running / memory being read or written), ``power_W``, ``temperature_C``; float, NaN where a query
        failed; no rows when nothing was sampled."""
        import pandas as pd

        return pd.DataFrame(list(self._rows), columns=list(self.COLUMNS), dtype="float64")

    def summary(self) -> dict:
        """``samples``, ``duration_s``, ``errors`` and, for each measured column ``c``, ``c_median`` and
        ``c_max`` (None without samples), plus ``sm_clock_MHz_min`` (a dip there means throttling)."""
        df = self.frame()
        out: dict = {"samples": len(df), "duration_s": float(df["t_s"].max()) if len(df) else None,
                     "errors": dict(self.errors)}
        for col in self.COLUMNS[1:]:
            s = df[col].dropna()
            out[f"{col}_median"] = float(s.median()) if len(s) else None
            out[f"{col}_max"] = float(s.max()) if len(s) else None
        s = df["sm_clock_MHz"].dropna()
        out["sm_clock_MHz_min"] = float(s.min()) if len(s) else None
        return out
