"""Bytes, GB/s, % of peak and the floor per traced step, against hand-computed values; the datasheet table of
known GPUs looked up from ``deviceProperties``; where the peak comes from."""

from __future__ import annotations

import pytest

from bubblescope import tracediagnose as td
from bubblescope.errors import BubblescopeError
from bubblescope.profiler.gpus import device_properties, lookup_peak

# tiny-llama, counted by hand: hidden 128, MLP 344, 4 layers, 8 heads and 2 KV heads of 16. Per layer: two
# RMSNorms 2·128, q and o 2·128·128, k and v 2·32·128, gate/up/down 3·344·128 = 173,312 elements; ×4 = 693,248;
# plus one embedding row (128), the final norm (128) and the tied LM head (1024·128 = 131,072): 824,576
# elements, 1,649,152 bytes in bf16. KV cache: K and V × 4 layers × 32 = 256 elements, 512 bytes per position.
TINY_WEIGHT_BYTES = 1_649_152
TINY_KV_BYTES = 512


def _entry(walls, name="NVIDIA H200", memory=150_109_880_320, first_context=None, host=None):
    return {"path": "t.json", "devices": [{"device": 0}], "host_name": host, "first_context": first_context,
            "device_properties": {"name": name, "total_memory_bytes": memory},
            "step_rows": [{"step": i, "warmup": i == 0, "wall_us": w} for i, w in enumerate(walls)]}


def test_bytes_and_rates_per_step_against_hand_computed_values():
    sb = td.resolve_step_bytes(bytes_per_step=2_400_000_000)
    bw = td.bandwidth_section(_entry([900.0, 1000.0, 2000.0, 1500.0]), sb, peak_gbps=4800.0)
    assert bw["kv"] == "given" and bw["peak_source"] == "--peak-gbps"
    # 2.4e9 bytes at 4800 GB/s: a 500-µs floor. Steps of 1000, 2000, 1500 µs: 2400, 1200, 1600 GB/s.
    got = [v for r in bw["rows"][1:] for v in (r["effective_GBps"], r["util_peak"], r["floor_us"],
                                                  r["over_floor_us"], r["over_floor_x"])]
    assert got == pytest.approx([2400, 0.5, 500, 500, 2.0, 1200, 0.25, 500, 1500, 4.0, 1600, 1 / 3, 500, 1000, 3.0])
    s = bw["summary"]  # the warm-up step (900 µs) is left out: median 1500 µs
    assert (s["steps"], s["step_us_p50"], s["effective_GBps"], s["util_peak"], s["floor_us"], s["over_floor_us"],
            s["over_floor_x"], s["best_util_peak"]) == pytest.approx((3, 1500, 1600, 1 / 3, 500, 1000, 3.0, 0.5))
    assert bw["verdict"] == ("1.500 ms per step, 3.00× the floor of 0.500 ms (1.000 ms above it): 33% of the "
                             "4,800 GB/s peak, 1,600 GB/s effective")


def test_model_bytes_grow_with_each_steps_context():
    sb = td.resolve_step_bytes(model="tiny-llama")
    walls = [1000.0] * 4
    given = td.bandwidth_section(_entry(walls), sb, context=100)
    # step k reads 100 + k positions and writes one
    assert [r["bytes"] for r in given["rows"]] == [TINY_WEIGHT_BYTES + (100 + k + 1) * TINY_KV_BYTES for k in range(4)]
    assert given["kv"] == "weights+kv" and given["context_source"] == "--context"
    assert [r["context"] for r in given["rows"]] == [100, 101, 102, 103]
    recorded = td.bandwidth_section(_entry(walls, first_context=50), sb)
    assert recorded["context_source"] == "trace" and recorded["rows"][0]["bytes"] == TINY_WEIGHT_BYTES + 51 * 512
    unknown = td.bandwidth_section(_entry(walls), sb)
    assert unknown["kv"] == "weights" and {r["bytes"] for r in unknown["rows"]} == {TINY_WEIGHT_BYTES}
    fp32 = td.bandwidth_section(_entry(walls), td.resolve_step_bytes(model="tiny-llama", dtype="fp32"))
    assert fp32["dtype"] == "float32" and fp32["rows"][0]["bytes"] == 2 * TINY_WEIGHT_BYTES
    with pytest.raises(BubblescopeError, match=r"^--context 65534: step traffic: context 65537 exceeds tiny-llama"):
        td.bandwidth_section(_entry(walls), sb, context=65534)


@pytest.mark.parametrize("name, memory_GB, peak", [
    ("NVIDIA H200", 150.1, 4800.0),
    ("NVIDIA H200 NVL", 150.1, 4800.0),
    ("NVIDIA H100 80GB HBM3", 85.0, 3350.0),
    ("NVIDIA H100 PCIe", 85.0, 2000.0),
    ("NVIDIA H100 NVL", 100.0, 3900.0),
    ("NVIDIA A100-PG509-200", 42.3, 1555.0),  # a 40 GB A100: one datasheet figure for PCIe and SXM
    ("NVIDIA A100-SXM4-80GB", 85.1, 2039.0),
    ("NVIDIA A100 80GB PCIe", 85.1, 1935.0),
    ("NVIDIA GH200 480GB", 102.0, 4000.0),
    ("NVIDIA L4", 24.0, 300.0),
    ("NVIDIA L40S", 48.0, 864.0),
    ("Tesla T4", 15.8, 320.0),
    ("Tesla V100-SXM2-16GB", 16.9, 900.0),
    ("NVIDIA H800", 85.0, 3350.0),
    ("NVIDIA H800 PCIe", 85.0, 2000.0),
    ("NVIDIA H20", 102.0, 4000.0),
    ("NVIDIA A800-SXM4-80GB", 85.1, 2039.0),
    ("NVIDIA A800 80GB PCIe", 85.1, 1935.0),
    ("NVIDIA A800-PCIE-40GB", 42.3, 1555.0),
    ("AMD Instinct MI300X", 205.8, 5300.0),
    ("AMD Instinct MI250X", 68.7, 1638.4),  # one of its two GCDs, each a device: half the module's 3.2 TB/s
    ("NVIDIA GeForce RTX 4090", 25.3, 1008.0),
    ("NVIDIA GeForce RTX 3090", 25.3, 936.0),
    ("NVIDIA GeForce RTX 5090", 33.7, 1792.0),
    ("NVIDIA GeForce RTX 4090 D", 25.3, 1008.0),
])
def test_known_gpus_by_name_and_memory(name, memory_GB, peak):
    got = lookup_peak(name, memory_GB * 1e9)
    assert got["peak_GBps"] == peak and ("datasheet" in got["source"] or "specifications" in got["source"])


@pytest.mark.parametrize("name, memory_GB, why", [
    ("NVIDIA H100", 85.0, "2.0 TB/s (PCIe), 3.35 TB/s (SXM) or 3.9 TB/s (NVL)"),
    ("NVIDIA A100", 85.1, "1,935 GB/s (PCIe) or 2,039 GB/s (SXM)"),
    ("NVIDIA GH200 480GB", 125.0, "fits neither"),
    ("Test GPU", 1.0, "not in bubblescope's table of known GPUs"),
    ("NVIDIA GH200", None, "fits neither"),  # the memory decides, and the trace gives none
    ("NVIDIA A800", 85.1, "1,935 GB/s (PCIe) or 2,039 GB/s (SXM)"),
    ("NVIDIA H20", 150.0, "not that one's"),  # a larger H20 than the datasheet's 96 GB
    # a laptop part or a Ti of a desktop card's number: 896, 576 and 1,008 GB/s, not the desktop 1,792, 1,008, 936
    ("NVIDIA GeForce RTX 5090 Laptop GPU", 25.7, "not in bubblescope's table"),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", 17.2, "not in bubblescope's table"),
    ("NVIDIA GeForce RTX 3090 Ti", 25.3, "not in bubblescope's table"),
])
def test_ambiguous_or_unknown_gpus_get_no_peak(name, memory_GB, why):
    got = lookup_peak(name, None if memory_GB is None else memory_GB * 1e9)
    assert got["peak_GBps"] is None and why in got["reason"]


def test_device_properties_of_the_step_device():
    meta = {"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "numSms": 132,
                                  "computeMajor": 9, "computeMinor": 0},
                                 {"id": 1, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85e9}]}
    assert device_properties(meta, 0) == {"name": "NVIDIA H200", "total_memory_bytes": 150109880320, "sm_count": 132,
                                          "compute_capability": "9.0"}
    assert device_properties(meta, 1)["name"] == "NVIDIA A100-SXM4-80GB"
    assert device_properties(meta, None) is None  # two different GPUs: which one is not known
    assert device_properties({}, 0) is None and device_properties({"deviceProperties": "x"}, 0) is None


def test_peak_order_option_then_table_then_nvml_of_this_machine(monkeypatch):
    from bubblescope.profiler import hardware

    h200 = _entry([1.0, 1.0])
    assert td.resolve_peak(h200, 3000.0)["peak_GBps"] == 3000.0  # the option wins over the table
    assert td.resolve_peak(h200)["peak_GBps"] == 4800.0
    here = "tracing-host"
    monkeypatch.setattr(td.socket, "gethostname", lambda: here)
    monkeypatch.setattr(hardware, "local_gpus", lambda: ([{"name": "Test GPU", "memory_bytes": 8e9,
                                                            "nvml_peak_GBps": 448.0}], None))
    odd = _entry([1.0, 1.0], name="Test GPU", memory=8e9, host=here)
    got = td.resolve_peak(odd)
    assert got["peak_GBps"] == 448.0 and got["source"] == "NVML of this machine's Test GPU"
    elsewhere = td.resolve_peak(_entry([1.0, 1.0], name="Test GPU", memory=8e9, host="other-host"))
    assert elsewhere["peak_GBps"] is None and "taken on other-host, not this machine" in elsewhere["reason"]
    nameless = td.resolve_peak(_entry([1.0, 1.0], name="Test GPU", memory=8e9))
    assert nameless["peak_GBps"] is None and "no host_name" in nameless["reason"]
    bigger = td.resolve_peak(_entry([1.0, 1.0], name="Test GPU", memory=16e9, host=here))  # another board
    assert bigger["peak_GBps"] is None
    cpu = td.resolve_peak({"devices": [], "device_properties": None})
    assert cpu["peak_GBps"] is None and "CPU-only" in cpu["reason"]


def test_unknown_peak_is_said_and_gives_no_percentage():
    bw = td.bandwidth_section(_entry([1.0, 2000.0], name="Test GPU", memory=8e9),
                              td.resolve_step_bytes(bytes_per_step=1_000_000_000), nvml=False)
    assert bw["peak_GBps"] is None and "not in bubblescope's table" in bw["peak_reason"]
    s = bw["summary"]
    assert s["effective_GBps"] == 500 and s["util_peak"] is None and s["floor_us"] is None
    assert bw["verdict"].startswith("2.000 ms per step, 500 GB/s effective (1.00 GB per step); peak bandwidth "
                                    "unknown (Test GPU is not in")


@pytest.mark.parametrize("kw, message", [
    ({"model": "no-such-model"}, "--model: unknown model 'no-such-model'"),
    ({"model": "tiny-llama", "bytes_per_step": 5}, "--model and --bytes-per-step: give one of them"),
    ({"bytes_per_step": 0}, "--bytes-per-step: must be a whole number of bytes > 0, got 0"),
    ({"bytes_per_step": -3}, "--bytes-per-step: must be a whole number of bytes > 0, got -3"),
    ({"model": "tiny-llama", "dtype": "int4"}, "--dtype: unknown dtype 'int4'"),
    ({"bytes_per_step": 5, "dtype": "bf16"}, "--dtype: sets the model's bytes per weight"),
    ({"model": " "}, "--model: empty"),
])
def test_bad_model_options(kw, message):
    with pytest.raises(BubblescopeError) as info:
        td.resolve_step_bytes(**kw)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_config_that_cannot_be_read(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(BubblescopeError, match=r"^--model: .*broken.json: not valid JSON"):
        td.resolve_step_bytes(model=str(bad))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(BubblescopeError, match="holds no config to read: give --bytes-per-step"):
        td.resolve_step_bytes(model=str(tmp_path / "weights.bin"))
    with pytest.raises(BubblescopeError, match="directory has no config.json"):
        td.resolve_step_bytes(model=str(tmp_path))


def _findings(entry):
    from bubblescope.reports.trace_findings import find_trace

    return find_trace({"files": [entry]})


def test_near_bandwidth_limit_fires_from_85_percent_of_peak():
    sb = td.resolve_step_bytes(bytes_per_step=4_000_000_000)
    near = _entry([1.0, 960.0, 960.0])  # 4e9 bytes in 0.96 ms: 4166.7 GB/s, 86.8 % of the H200's 4800
    near["bandwidth"] = td.bandwidth_section(near, sb)
    (f,) = [x for x in _findings(near) if x["rule"] == "near-bandwidth-limit"]
    assert f["severity"] == "info" and f["title"] == ("Near the bandwidth limit: the median step is 1.15× the "
                                                      "floor, 87% of peak")
    assert f["evidence"] == pytest.approx({"util_peak": 4e9 / 0.96e-3 / 1e9 / 4800, "effective_GBps": 4e9 / 0.96e6,
                                           "step_wall_us": 960, "floor_us": 4e9 / 4800 / 1e3, "over_floor_x": 1.152})
    far = _entry([1.0, 1000.0, 1000.0])  # 83.3 % of peak: below a copy's reach by more than a few percent
    far["bandwidth"] = td.bandwidth_section(far, sb)
    assert not [x for x in _findings(far) if x["rule"] == "near-bandwidth-limit"]
    unknown = _entry([1.0, 1000.0, 1000.0], name="Test GPU")  # no peak, no percentage, no finding
    unknown["bandwidth"] = td.bandwidth_section(unknown, sb, nvml=False)
    assert not [x for x in _findings(unknown) if x["rule"] == "near-bandwidth-limit"]


def test_steps_uncertain_fires_only_for_low_confidence_found_steps():
    from bubblescope.profiler.trace.periodic import confidence

    assert (confidence(12, 12, 0.95), confidence(5, 5, 1.0), confidence(10, 6, 0.6)) == ("high", "medium", "low")
    entry = _entry([1.0, 1.0])
    entry["steps"] = {"available": True}
    entry["step_detection"] = {"method": "sequence", "confidence": "low", "steps": 10, "matching_steps": 6,
                               "units_per_step": 40, "coverage": 0.6}
    (f,) = [x for x in _findings(entry) if x["rule"] == "steps-uncertain"]
    assert f["severity"] == "warn" and f["evidence"] == {"steps": 10, "matching_steps": 6, "units_per_step": 40,
                                                         "coverage": 0.6}
    assert f["title"] == "Steps found without markers with low confidence: 6 of 10 steps repeat the common sequence " \
                         "exactly"
    for method, conf in (("sequence", "medium"), ("marker", "high")):
        entry["step_detection"].update(method=method, confidence=conf)
        assert not [x for x in _findings(entry) if x["rule"] == "steps-uncertain"]


def test_a_tiny_models_rate_and_bytes_read_the_same_in_the_verdict_and_the_table():
    """stories260K's trace said "0 GB/s effective (0.001 GB per step)" above a table of 0.3 GB/s and 0.0005 GB."""
    from bubblescope.reports.trace_tables import bandwidth_rows

    sb = td.resolve_step_bytes(bytes_per_step=541_312)
    bw = td.bandwidth_section(_entry([2000.0, 1786.0, 1786.0], name="Test GPU"), sb, nvml=False)
    # 541,312 bytes in 1,786 µs: 0.30309 GB/s, printed as the tables print GB/s and bytes
    assert bw["verdict"].startswith("1.786 ms per step, 0.3 GB/s effective (541.31 kB per step); peak bandwidth "
                                    "unknown")
    rows = dict(bandwidth_rows(bw))
    assert rows["effective bandwidth"] == "0.3 GB/s" and rows["bytes per step (median)"] == "541.31 kB"


def test_a_floor_under_a_microsecond_is_not_printed_as_zero_ms():
    """stories260K's 1 MB at 4,800 GB/s: a 0.2-µs floor, which the verdict printed as "the floor of 0.000 ms"."""
    bw = td.bandwidth_section(_entry([16000.0, 15615.0, 15615.0]), td.resolve_step_bytes(bytes_per_step=1_000_000),
                              peak_gbps=4800.0)
    assert "the floor of 0.2 µs (15.615 ms above it)" in bw["verdict"]
