"""Device description, NVML peak, copy bandwidth and the NVML sampler.

NVML is mocked by replacing functions of the real ``pynvml`` module (its error classes stay real), and
torch's CUDA queries by replacing ``torch.cuda`` functions, so the GPU code paths run on a CPU machine.
"""

from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.profiler.hardware import NvmlSampler, device_info, measure_copy_bandwidth, nvml_peak_GBps

pynvml = pytest.importorskip("pynvml")

UUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
H200_PROPS = SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=60 * 2**20,
                             total_memory=150_000_000_000, uuid=UUID)


def nvml_error(code):
    return pynvml.NVMLError(code)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: H200_PROPS)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def fake_nvml(monkeypatch):
    """An H200 as NVML describes it; tests override single functions to inject failures."""
    calls = {"init": 0, "shutdown": 0}

    def init():
        calls["init"] += 1

    def shutdown():
        calls["shutdown"] += 1

    def by_uuid(u):
        if u != "GPU-" + UUID:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return "handle-0"

    def max_clock(handle, kind):
        assert handle == "handle-0"
        return {pynvml.NVML_CLOCK_MEM: 3201, pynvml.NVML_CLOCK_SM: 1980}[kind]

    def mig_mode(handle):
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name, fn in {"nvmlInit": init, "nvmlShutdown": shutdown, "nvmlDeviceGetHandleByUUID": by_uuid,
                     "nvmlDeviceGetHandleByIndex": lambda i: f"handle-{i}",
                     "nvmlDeviceGetMemoryBusWidth": lambda h: 6016, "nvmlDeviceGetMaxClockInfo": max_clock,
                     "nvmlDeviceGetMigMode": mig_mode,
                     "nvmlSystemGetDriverVersion": lambda: "580.82.07"}.items():
        monkeypatch.setattr(pynvml, name, fn)
    return calls


def test_nvml_peak_formula():
    # H200: 6016-bit bus = 752 bytes per transfer; 3201 MHz × 2 transfers per clock = 6.402e9 per s.
    assert nvml_peak_GBps(6016, 3201) == pytest.approx(752 * 6.402e9 / 1e9)
    assert round(nvml_peak_GBps(6016, 3201)) == 4814
    assert nvml_peak_GBps(None, 3201) is None
    assert nvml_peak_GBps(6016, None) is None
    with pytest.raises(BubblescopeError):
        nvml_peak_GBps(0, 3201)


def test_cpu_description():
    info = device_info("cpu")
    assert info["type"] == "cpu"
    assert info["cpu_count"] == os.cpu_count()
    assert info["torch_version"] == torch.__version__
    for key in ("sm_count", "l2_bytes", "bus_width_bits", "nvml_peak_GBps", "max_mem_clock_MHz", "mig"):
        assert info[key] is None
    assert isinstance(info["name"], str) and info["name"]


def test_cuda_requested_without_cuda_describes_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = device_info("cuda:0")
    assert info["type"] == "cpu" and info["nvml_peak_GBps"] is None
    assert any("torch.cuda.is_available() is False" in n for n in info["notes"])


def test_h200_with_nvml(fake_cuda, fake_nvml):
    info = device_info("cuda:0")
    assert info["type"] == "cuda" and info["index"] == 0 and info["name"] == "NVIDIA H200"
    assert info["sm_count"] == 132 and info["l2_bytes"] == 60 * 2**20
    assert info["bus_width_bits"] == 6016 and info["max_mem_clock_MHz"] == 3201 and info["max_sm_clock_MHz"] == 1980
    assert info["nvml_peak_GBps"] == pytest.approx(6016 / 8 * 3201e6 * 2 / 1e9)
    assert info["driver_version"] == "580.82.07" and info["cuda_version"] == "13.0"
    assert info["mig"] is False  # NotSupported from nvmlDeviceGetMigMode means "no MIG on this GPU"
    assert info["notes"] == []
    assert fake_nvml == {"init": 1, "shutdown": 1}


def test_mig_refusals_become_none_with_notes(fake_cuda, fake_nvml, monkeypatch):
    def refused(*args):
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def no_permission(*args):
        raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", lambda h: [pynvml.NVML_DEVICE_MIG_ENABLE, 1])
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: b"535.54.03")  # older pynvml: bytes
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryBusWidth", refused)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxClockInfo", no_permission)
    info = device_info("cuda")
    assert info["mig"] is True
    assert info["bus_width_bits"] is None and info["max_mem_clock_MHz"] is None and info["nvml_peak_GBps"] is None
    assert info["sm_count"] == 132  # torch's values survive
    assert info["driver_version"] == "535.54.03"
    notes = " | ".join(info["notes"])
    assert "memory bus width: Not Supported" in notes
    assert "max memory clock: Insufficient Permissions" in notes
    assert "MIG is on" in notes
    assert fake_nvml["shutdown"] == 1


def test_nvml_missing_leaves_nvml_fields_none(fake_cuda, fake_nvml, monkeypatch):
    def no_library():
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    info = device_info("cuda:0")
    assert info["type"] == "cuda" and info["sm_count"] == 132
    assert info["bus_width_bits"] is None and info["nvml_peak_GBps"] is None and info["driver_version"] is None
    assert any(n.startswith("NVML unavailable (NVML Shared Library Not Found)") for n in info["notes"])


def test_unknown_uuid_falls_back_to_index_with_note(fake_cuda, fake_nvml, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(**{**vars(H200_PROPS), "uuid": "ffffffff-0000-0000-0000-000000000000"}))
    info = device_info("cuda:0")
    assert info["bus_width_bits"] == 6016
    assert any("CUDA_VISIBLE_DEVICES" in n for n in info["notes"])


@pytest.mark.parametrize("device", ["cuda:3", "mps", "gpu:0"])
def test_bad_devices(fake_cuda, device):
    with pytest.raises(BubblescopeError) as e:
        device_info(device)
    assert "\n" not in str(e.value) and device.split(":")[0] in str(e.value)


def test_copy_bandwidth_on_cpu_gives_reason():
    out = measure_copy_bandwidth("cpu")
    assert out["copy_GBps"] is None and out["samples_ms"] is None and out["nbytes"] is None
    assert "no CUDA device" in out["reason"]
    with pytest.raises(BubblescopeError):
        measure_copy_bandwidth("cpu", iters=0)
    with pytest.raises(BubblescopeError):
        measure_copy_bandwidth("cpu", nbytes=-1)


def test_sampler_with_mocked_nvml(fake_nvml, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no UUID: NVML index 0 is used
    sm_clocks = iter([1980, 1755] * 1000)

    def clock(handle, kind):
        assert handle == "handle-0"
        return next(sm_clocks) if kind == pynvml.NVML_CLOCK_SM else 3201

    def no_temperature(*args):
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", clock)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=87, memory=41))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 412_500)  # milliwatts
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", no_temperature)
    with NvmlSampler(0, interval_ms=5) as s:
        time.sleep(0.1)
    assert s.available and s.reason is None
    df = s.frame()
    n = len(df)
    assert n >= 3
    assert list(df.columns) == ["t_s", "sm_clock_MHz", "mem_clock_MHz", "gpu_util_pct", "mem_util_pct",
                                "power_W", "temperature_C"]
    assert df["sm_clock_MHz"].tolist() == ([1980, 1755] * n)[:n]
    assert (df["power_W"] == 412.5).all() and (df["gpu_util_pct"] == 87).all() and (df["mem_util_pct"] == 41).all()
    assert df["temperature_C"].isna().all()
    assert df["t_s"].is_monotonic_increasing and df["t_s"].iloc[0] >= 0
    summary = s.summary()
    assert summary["samples"] == n
    assert summary["sm_clock_MHz_median"] == statistics.median(([1980, 1755] * n)[:n])
    assert summary["sm_clock_MHz_max"] == 1980 and summary["sm_clock_MHz_min"] == 1755
    assert summary["power_W_median"] == 412.5
    assert summary["temperature_C_median"] is None and summary["errors"] == {"temperature_C": n}
    assert fake_nvml["shutdown"] == 1


def test_sampler_without_nvml(monkeypatch):
    def no_library():
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with NvmlSampler() as s:
        pass
    assert not s.available and "NVML unavailable" in s.reason
    assert len(s.frame()) == 0 and list(s.frame().columns)[0] == "t_s"
    assert s.summary()["samples"] == 0 and s.summary()["power_W_max"] is None


def test_sampler_rejects_bad_arguments():
    with pytest.raises(BubblescopeError):
        NvmlSampler(-1)
    with pytest.raises(BubblescopeError):
        NvmlSampler(0, interval_ms=0)


def test_import_is_light():
    # The module is on the CLI path: importing it must not import torch, pandas or pynvml by itself.
    import subprocess
    import sys

    code = ("import sys, bubblescope.profiler.hardware, bubblescope.profiler.traffic, bubblescope.profiler.capture;"
            "print(sorted(m for m in ('torch', 'pandas', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_real_gpu_description_and_copy_bandwidth():
    info = device_info("cuda:0")
    assert info["type"] == "cuda" and info["sm_count"] > 0 and info["l2_bytes"] > 0
    out = measure_copy_bandwidth("cuda:0", iters=10)
    assert out["nbytes"] >= max(8 * info["l2_bytes"], 2**30) and len(out["samples_ms"]) == 10
    # Independent timing: wall clock over many copies of the same size, synchronised at both ends.
    src = torch.ones(out["nbytes"], dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    wall_GBps = 2 * out["nbytes"] * 20 / (time.perf_counter() - t0) / 1e9
    assert 0.7 * wall_GBps < out["copy_GBps"] < 1.5 * wall_GBps
    if info["nvml_peak_GBps"] is not None:
        assert out["copy_GBps"] < 1.02 * info["nvml_peak_GBps"]
