"""Timeline metrics on hand-built traces; every expected number is worked out by hand in the comments.

The main trace is ``tracegen.decode_trace_events`` (its docstring draws it): two decode steps on
device 0, one of them a CUDA-graph replay, plus a launch-less kernel and a kernel on device 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from bubblescope.errors import BubblescopeError
from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace import metrics as m
from bubblescope.profiler.trace import steps as st
from bubblescope.profiler.trace import timeline as tm
from bubblescope.profiler.trace.arraysummary import overlap_note
from bubblescope.profiler.trace.categories import categorize
from bubblescope.profiler.trace.summary import summarize_traces
from bubblescope.reports.trace_terminal import render_trace_summary

from . import tracegen as tg


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode") / "decode.json.gz"
    return load_trace(tg.write(path, tg.document(tg.decode_trace_events())))


def test_overlap_on_two_streams_and_known_gaps(tmp_path):
    # k1 [100,110] s7 and k2 [105,120] s8 overlap -> one busy interval of 20; k3 [130,133] after a gap of 10
    # whose launch (125) came after 120 -> host-wait; k4 [134,140], launched at 128 < 133, gap 1 < 5 ->
    # kernel-wait; k5 [150,160] launched at 131 < 140, gap 10 >= 5 -> other.
    ev = [
        tg.launch(95, 1, 1),
        tg.kernel("k1", 100, 10, 1, stream=7),
        tg.launch(96, 1, 2),
        tg.kernel("k2", 105, 15, 2, stream=8),
        tg.launch(125, 1, 3),
        tg.kernel("k3", 130, 3, 3),
        tg.launch(128, 1, 4),
        tg.kernel("k4", 134, 6, 4),
        tg.launch(131, 1, 5),
        tg.kernel("k5", 150, 10, 5),
    ]
    tr = load_trace(tg.write(tmp_path / "gaps.json", tg.document(ev)))
    row = m.device_summary(tr).iloc[0]
    busy, span = 20 + 3 + 6 + 10, 160 - 100
    assert (row["kernels"], row["streams"], row["busy_us"], row["span_us"]) == (5, 2, busy, span)
    assert row["bubble_ratio"] == pytest.approx(1 - 39 / 60)
    idle = m.idle_breakdown(tr).iloc[0]
    assert (idle["host_wait_us"], idle["kernel_wait_us"], idle["other_us"], idle["idle_us"]) == (10, 1, 10, 21)
    assert idle["host_wait_share"] == pytest.approx(10 / 21)
    # a threshold of 0.5 µs turns the 1-µs kernel-wait into other; 20 µs turns the 10-µs other into kernel-wait
    assert m.idle_breakdown(tr, threshold_us=0.5).iloc[0][["kernel_wait_us", "other_us"]].tolist() == [0, 11]
    assert m.idle_breakdown(tr, threshold_us=20).iloc[0][["kernel_wait_us", "other_us"]].tolist() == [11, 0]
    # window [105, 132]: k1 clipped to [105,110], k2 [105,120], k3 clipped to [130,132] -> busy 15+2, span 27
    w = m.device_summary(tr, window=(105, 132)).iloc[0]
    assert (w["busy_us"], w["span_us"], w["kernels"]) == (17, 27, 3)


def test_device_summary_whole_trace(decode):
    d = m.device_summary(decode).set_index("device")
    # device 0: step 0 busy 29 (see below), graph 14, orphan [300,301] 1 -> 44 over [100, 301]
    assert d.loc[0, ["kernels", "memcpys", "memsets", "streams"]].tolist() == [8, 1, 0, 3]
    assert (d.loc[0, "busy_us"], d.loc[0, "span_us"]) == (44, 201)
    assert d.loc[0, "bubble_ratio"] == pytest.approx(1 - 44 / 201)
    # gaps: 120->130 host 10, 133->134 kernel 1, 140->142 kernel 2, 142->165 host 23 (graph launched at 150),
    # 170->171 kernel 1, 175->180 other 5 (not < 5), 185->300 other 115 (orphan has no launch call)
    assert d.loc[0, ["host_wait_us", "kernel_wait_us", "other_idle_us"]].tolist() == [33, 4, 120]
    assert d.loc[1, ["kernels", "busy_us", "span_us", "bubble_ratio"]].tolist() == [1, 10, 10, 0]


def test_steps_and_assignment(decode):
    steps = st.find_steps(decode)
    assert steps["name"].tolist() == ["bubblescope.decode_step#0", "bubblescope.decode_step#1"]
    assert steps["matched_by"].tolist() == ["thread", "thread"]
    assigned = st.assign_steps(decode)
    by_name = {(n, t): s for n, t, s in zip(decode.gpu["name"], decode.gpu["ts_us"], assigned)}
    assert by_name[("gemv_a", 100)] == 0 and by_name[("Memcpy DtoD (Device -> Device)", 142)] == 0
    assert [by_name[(n, t)] for n, t in (("gemv_a", 165), ("flash_fwd_kernel", 171), ("rmsnorm_b", 180))] == [1, 1, 1]
    # the orphan has no launch; device 1's kernel was launched from another thread than the steps'
    assert assigned.isna().sum() == 2
    assert pd.isna(by_name[("orphan_kernel", 300)]) and pd.isna(by_name[("gemv_a", 500)])
    assert len(st.find_steps(decode, "bubblescope.decode")) == 0  # a prefix must be followed by '#'


def test_step_metrics(decode):
    t = st.step_metrics(decode).set_index("step")
    # step 0 [90,145): merged [100,120] [130,133] [134,140] [142,142] -> busy 29, span 42;
    # idle: host 10, kernel 1 + 2 (memcpy queued at 135 < 140, gap 2), other 0
    assert t.loc[0, ["wall_us", "kernels", "launches", "gpu_busy_us", "gpu_span_us"]].tolist() == [55, 4, 4, 29, 42]
    assert t.loc[0, ["launch_us", "sync_us", "host_wait_us", "kernel_wait_us", "other_idle_us"]].tolist() == [
        10,
        3,
        10,
        3,
        0,
    ]
    assert t.loc[0, "bubble_ratio"] == pytest.approx(1 - 29 / 42)
    assert t.loc[0, "launch_share"] == pytest.approx(10 / 55) and t.loc[0, "sync_share"] == pytest.approx(3 / 55)
    # step 1 [145,200): one cudaGraphLaunch (10 µs) -> g1 [165,170] g2 [171,175] g3 [180,185]: busy 14, span 20;
    # 170->171 kernel-wait 1 (launch long before), 175->180 other 5
    assert t.loc[1, ["kernels", "launches", "gpu_busy_us", "gpu_span_us", "launch_us", "sync_us"]].tolist() == [
        3,
        1,
        14,
        20,
        10,
        0,
    ]
    assert t.loc[1, ["host_wait_us", "kernel_wait_us", "other_idle_us"]].tolist() == [0, 1, 5]
    assert t.loc[1, "bubble_ratio"] == pytest.approx(0.3)
    # every step: idle parts add up to span - busy
    assert np.allclose(
        t[["host_wait_us", "kernel_wait_us", "other_idle_us"]].sum(axis=1), t["gpu_span_us"] - t["gpu_busy_us"]
    )


def test_launch_delays(decode):
    d = st.launch_delays(decode)
    first = d[d["first_in_launch"]].sort_values("start_us")
    # k1 100-95, k2 105-99, k3 130-125, k4 134-128, g1 165-150, device-1 kernel 500-100 (any thread)
    assert first["delay_us"].tolist() == [5, 6, 5, 6, 15, 400]
    assert d[~d["first_in_launch"]]["delay_us"].tolist() == [21, 30]  # g2 171-150, g3 180-150
    assert set(d["launch_name"]) == {"cudaLaunchKernel", "cudaGraphLaunch"}  # not the memcpy's cudaMemcpyAsync


def test_timeline_summary(decode):
    s = tm.timeline_summary(decode)
    assert set(s) == {
        "available",
        "reason",
        "steps",
        "device",
        "kernels_per_step",
        "launches_per_step",
        "launches_per_s",
        "bubble_ratio",
        "bubble_ratio_steps",
        "launch_share",
        "sync_share",
        "gpu_busy_us_per_step",
        "step_wall_us",
        "idle",
        "launch_delay_us",
        "top_kernels",
        "categories",
        "max_registers_per_thread",
    }
    assert s["available"] is True and s["reason"] is None and s["steps"] == 2 and s["device"] == 0
    assert (s["kernels_per_step"], s["launches_per_step"], s["step_wall_us"]) == (3.5, 2.5, 55)
    assert s["launches_per_s"] == pytest.approx(2.5 / 55e-6)
    # decode window [100, 185]: busy 29 + 14 = 43 of 85
    assert s["bubble_ratio"] == pytest.approx(1 - 43 / 85)
    assert s["bubble_ratio_steps"] == pytest.approx([1 - 29 / 42, 0.3])
    assert s["launch_share"] == pytest.approx(20 / 110) and s["sync_share"] == pytest.approx(3 / 110)
    assert s["gpu_busy_us_per_step"] == 21.5
    assert s["idle"] == {"host_wait_us": 5, "kernel_wait_us": 2, "other_us": 2.5, "threshold_us": 5.0}
    # first kernels of each launch in the steps: 5, 5, 6, 6, 15 -> p90 = 6 + 0.6 * (15 - 6)
    assert s["launch_delay_us"] == pytest.approx({"p50": 6, "p90": 11.4, "max": 15})
    # rmsnorm_b: 15 + 5 = 20, gemv_a: 10 + 3 + 5 = 18 of 10+15+3+6+0+5+4+5 = 48 µs in the steps
    assert s["top_kernels"][:2] == [
        {"name": "rmsnorm_b", "category": "norm", "count": 2, "total_us": 20, "share": pytest.approx(20 / 48)},
        {"name": "gemv_a", "category": "gemm/gemv", "count": 3, "total_us": 18, "share": pytest.approx(18 / 48)},
    ]
    cats = {c["category"]: (c["count"], c["total_us"]) for c in s["categories"]}
    assert cats == {
        "gemm/gemv": (3, 18),
        "norm": (2, 20),
        "attention": (1, 4),
        "elementwise/activation": (1, 6),
        "copy/memset": (1, 0),
    }
    assert s["max_registers_per_thread"] is None  # no kernel carried the arg
    json.dumps(s, allow_nan=False)

    warm = tm.timeline_summary(decode, skip_steps=1)
    assert warm["steps"] == 1 and warm["bubble_ratio"] == pytest.approx(0.3) and warm["kernels_per_step"] == 3
    assert tm.timeline_summary(decode, skip_steps=2)["reason"] == "all 2 steps are warm-up (skip_steps=2)"


def test_timeline_summary_without_steps_or_gpu(tmp_path):
    none = tm.timeline_summary(load_trace(tg.write(tmp_path / "a.json", tg.document([tg.kernel("k", 1, 1, 1)]))))
    assert none["available"] is False and "no step marker" in none["reason"] and none["kernels_per_step"] is None
    # No step but a launch call: the per-step frame is empty (indexing the steps' ends raised IndexError).
    unmarked = load_trace(tg.write(tmp_path / "u.json", tg.document([tg.launch(1, 1, 1), tg.kernel("k", 3, 1, 1)])))
    table = st.step_metrics(unmarked)
    assert table.empty and "bubble_ratio" in table and st.assign_steps(unmarked).isna().all()
    # CPU-only: steps and launch calls but no kernels (e.g. CUPTI off). Launch 2 of 10 µs, sync 5 of 10 µs.
    ev = [
        tg.annotation("bubblescope.decode_step#0", 0.5, 10),
        tg.launch(1, 1, 1),
        tg.launch(3, 1, 2),
        tg.api("cudaDeviceSynchronize", 5, 5, 3),
    ]
    cpu = tm.timeline_summary(load_trace(tg.write(tmp_path / "c.json", tg.document(ev))))
    assert cpu["available"] is False and cpu["reason"] == "no GPU activity in trace (CPU-only run)"
    assert (cpu["launches_per_step"], cpu["launch_share"], cpu["sync_share"]) == (2, 0.2, 0.5)
    assert cpu["bubble_ratio"] is None and cpu["kernels_per_step"] is None and cpu["launch_delay_us"]["p50"] is None


def test_marker_on_another_thread_falls_back_to_time(tmp_path):
    # ProfilerStep on pid 9 (which made no CUDA call) covering [0, 100): the launch at 10 is matched by time.
    ev = [
        tg.annotation("ProfilerStep#3", 0.5, 100, pid=9, tid=9),
        tg.launch(10, 2, 1),
        tg.kernel("k", 20, 4, 1, **{"registers per thread": 32}),
    ]
    tr = load_trace(tg.write(tmp_path / "p.json", tg.document(ev)))
    assert st.find_steps(tr, "ProfilerStep")["matched_by"].tolist() == ["time"]
    s = tm.timeline_summary(tr, "ProfilerStep")
    assert s["available"] and s["kernels_per_step"] == 1 and s["launch_delay_us"]["max"] == 10
    assert s["max_registers_per_thread"] == 32
    assert tm.timeline_summary(tr, "ProfilerStep#")["steps"] == 1
    # a marker without pid/tid cannot be matched by thread either
    bare = tg.annotation("ProfilerStep#4", 200, 50)
    del bare["pid"], bare["tid"]
    tr2 = load_trace(
        tg.write(tmp_path / "q.json", tg.document([*ev, bare, tg.launch(210, 1, 2), tg.kernel("k", 215, 2, 2)]))
    )
    assert st.find_steps(tr2, "ProfilerStep")["matched_by"].tolist() == ["time", "time"]
    assert st.step_metrics(tr2, "ProfilerStep")["kernels"].tolist() == [1, 1]


def test_cpu_only_trace_warns_once_about_its_missing_gpu(tmp_path):
    """Fresh-user finding: `diagnose trace` on a CPU run's trace (no CUDA call, no GPU activity) printed three
    warnings for one fact, among them "8 of 8 steps ... lie on a thread without CUDA calls: launches matched to
    them by time only", though there is no launch to match."""
    steps = [tg.annotation(f"bubblescope.decode_step#{i}", 10.0 * i, 8) for i in range(3)]
    (only,) = summarize_traces([tg.write(tmp_path / "cpu.json", tg.document(steps))])["files"]
    assert only["warnings"] == ["no GPU activity in trace (CPU-only run)"]
    assert only["steps"]["steps"] == 3 and only["steps"]["available"] is False
    # A marker on another thread than the launches (CUPTI off: launch calls, no kernels) still warns.
    other = [*(dict(a, pid=9, tid=9) for a in steps), tg.launch(1, 1, 1)]
    (cupti_off,) = summarize_traces([tg.write(tmp_path / "off.json", tg.document(other))])["files"]
    assert any("3 of 3 steps marked 'bubblescope.decode_step' lie on a thread without CUDA calls" in w
               for w in cupti_off["warnings"])


def test_cpu_only_trace_says_so_once_in_the_terminal(tmp_path):
    """The terminal report of a CPU run's trace: the "No GPU activity" line once, not again as a warning."""
    from rich.console import Console

    from bubblescope.reports.trace_terminal import render_trace_summary
    steps = [tg.annotation(f"bubblescope.decode_step#{i}", 10.0 * i, 8) for i in range(3)]
    summary = summarize_traces([tg.write(tmp_path / "cpu.json", tg.document(steps))])
    console = Console(record=True, width=120)
    render_trace_summary(summary, console)
    text = console.export_text()
    assert text.count("No GPU activity in this trace (CPU-only run)") == 1
    assert "warning: no GPU activity" not in text


def test_step_timeline(decode):
    tl = tm.step_timeline(decode, "bubblescope.decode_step", 1)
    assert tl["launches"] == [{"name": "cudaGraphLaunch", "start_us": 5.0, "dur_us": 10.0}]
    assert [(k["name"], k["stream"], k["start_us"], k["dur_us"]) for k in tl["kernels"]] == [
        ("gemv_a", 9, 20.0, 5.0),
        ("flash_fwd_kernel", 9, 26.0, 4.0),
        ("rmsnorm_b", 9, 35.0, 5.0),
    ]
    assert tl["kernels"][1]["category"] == "attention"
    with pytest.raises(BubblescopeError, match="out of range"):
        tm.step_timeline(decode, "bubblescope.decode_step", 2)


@pytest.mark.parametrize("bad", [-1, float("nan"), "x", float("inf")])
def test_bad_threshold(decode, bad):
    with pytest.raises(BubblescopeError, match="--idle-threshold-us"):
        tm.timeline_summary(decode, threshold_us=bad)


@pytest.mark.parametrize(
    "name,category",
    [
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
            "gemm/gemv",
        ),
        ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", "gemm/gemv"),
        (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)",
            "gemm/gemv",
        ),
        ("ampere_sgemm_128x64_nn", "gemm/gemv"),
        ("cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn", "gemm/gemv"),
        ("nvjet_hsh_128x64_64x6_2x1_v_bz_coopB_NTN", "gemm/gemv"),
        (
            "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>>",
            "attention",
        ),
        (
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>)",
            "attention",
        ),
        ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
        ("triton_poi_fused_cat_cos_sin_mul_2", "rope"),
        ("triton_red_fused_argmax_3", "reduction/sampling"),
        ("triton_red_fused_sum_4", "reduction/sampling"),
        ("triton_poi_fused_mul_silu_1", "elementwise/activation"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
            "elementwise/activation",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float>>>",
            "reduction/sampling",
        ),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "reduction/sampling"),
        ("void at::native::sbtopk::gatherTopK<float, unsigned int, 1, false>", "reduction/sampling"),
        ("void at::native::bitonicSortKVInPlace<float, long>", "reduction/sampling"),
        ("bubblescope_megakernel_step", "megakernel"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        ("void fft2d_c2r_32x32<float, false>(float*, cudnn::reduced_divisor)", "other"),
        ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", "copy/memset"),
    ],
)
def test_categories_on_real_names(name, category):
    assert categorize(name) == category


def test_memcpy_and_memset_kinds_are_copies():
    assert (
        categorize("Memcpy DtoD (Device -> Device)", "memcpy")
        == categorize("Memset (Device)", "memset")
        == "copy/memset"
    )


def test_summarize_traces_and_render(tmp_path, decode):
    cpu = tg.write(tmp_path / "cpu.json", tg.document([tg.api("cudaMalloc", 1, 2, 3)], rank="1"))
    s = summarize_traces([decode.path, cpu], threshold_us=5)
    json.dumps(s, allow_nan=False)
    assert s["schema"] == "bubblescope.trace/1" and [f["rank"] for f in s["files"]] == [0, 1]
    first, second = s["files"]
    assert first["step_marker"] == "bubblescope.decode_step" and first["steps"]["steps"] == 2
    dev0 = first["devices"][0]
    assert (dev0["device"], dev0["kernels"], dev0["busy_us"], dev0["span_us"]) == (0, 8, 44, 201)
    assert dev0["idle"]["host_wait_us"] == 33 and dev0["idle"]["other_share"] == pytest.approx(120 / 157)
    # device 0 in all: rmsnorm_b 15 + 5 = 20 of 10+15+3+6+0+5+4+5+1 = 49 µs
    assert dev0["top_kernels"][0] == {
        "name": "rmsnorm_b",
        "category": "norm",
        "count": 2,
        "total_us": 20,
        "share": pytest.approx(20 / 49),
    }
    assert second["devices"] == [] and second["steps"] is None
    assert "no GPU activity in trace (CPU-only run)" in second["warnings"]

    console = Console(record=True, width=200)
    render_trace_summary(s, console)
    text = console.export_text()
    assert "0.781" in text  # 1 - 44/201 = 0.7811
    assert "flash_fwd_kernel" in text and "CPU-only" in text


def test_a_huge_duration_keeps_the_tables_in_80_columns(tmp_path):
    """A kernel with dur 1e15 µs printed "1,000,000,000.00 s": at 80 columns the device table cut its
    headers and cells ("kern…", "1,000,000,000.0…") and the top-kernels table lost its share column. Times
    from 10,000 s on are written in powers of ten."""
    from bubblescope.reports.trace_tables import us as _us

    assert [_us(v) for v in (999.0, 1234.5, 9_999.99e6, 1e10, 1e21, -1e15)] == [
        "999.0 µs", "1.23 ms", "9,999.99 s", "1.00e+04 s", "1.00e+15 s", "-1.00e+09 s"]
    events = tg.decode_trace_events()
    gemv = next(e for e in events if e.get("name") == "gemv_a")
    gemv["dur"] = 1e15
    console = Console(record=True, width=80, color_system=None)
    render_trace_summary(summarize_traces([tg.write(tmp_path / "huge.json", tg.document(events))]), console)
    text = console.export_text().split("\n", 1)[1]  # the tables: after the rule naming the (long) tmp path
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "1.00e+09 s" in text
    for header in ("kernels", "memcpy", "streams", "bubble", "ratio", "total", "share"):
        assert f" {header} " in text, header
    assert "100.0 %" in text  # the share column of the top kernels, whole


def test_render_prints_names_literally():
    summary = {
        "files": [
            {
                "path": "x.json",
                "rank": None,
                "step_marker": None,
                "steps": None,
                "warnings": ["w[1]"],
                "devices": [
                    {
                        "device": 0,
                        "kernels": 1,
                        "memcpys": 0,
                        "memsets": 0,
                        "streams": 1,
                        "busy_us": 1.0,
                        "span_us": 1.0,
                        "bubble_ratio": 0.0,
                        "idle": {},
                        "categories": [],
                        "top_kernels": [
                            {
                                "name": "[bold]void f<int, 4>()[/bold]",
                                "category": "other",
                                "count": 1,
                                "total_us": 1.0,
                                "share": 1.0,
                            }
                        ],
                    }
                ],
            }
        ]
    }
    console = Console(record=True, width=200)
    render_trace_summary(summary, console)
    text = console.export_text()
    assert "[bold]void f<int, 4>()[/bold]" in text and "warning: w[1]" in text


def test_summarize_traces_bad_input(tmp_path):
    with pytest.raises(BubblescopeError, match="no trace paths"):
        summarize_traces([])
    with pytest.raises(BubblescopeError, match="holds no"):
        summarize_traces([tmp_path])
    with pytest.raises(BubblescopeError, match="^--step-marker ' ': must be a non-empty name$"):
        summarize_traces([tmp_path], step_marker=" ")


def test_render_prints_a_markup_step_marker_literally(tmp_path):
    """The marker is user input and goes into a table title: "[/]" once raised rich's MarkupError."""
    events = [tg.annotation("[/]#0", 0, 20), tg.launch(1, 2, 1), tg.kernel("k", 5, 10, 1)]
    s = summarize_traces([tg.write(tmp_path / "m.json", tg.document(events))], step_marker="[/]")
    assert s["files"][0]["step_marker"] == "[/]" and s["files"][0]["steps"]["steps"] == 1
    console = Console(record=True, width=200)
    render_trace_summary(s, console)
    assert "Decode steps (marker '[/]')" in console.export_text()


def test_overlapping_step_ranges_are_warned_once_and_each_call_counts_in_one_step(tmp_path):
    """QA finding: overlapping ProfilerStep ranges gave no warning (and a nest lost the outer step's calls after
    the inner one). Hand-made: #0 [0, 100) and #1 [90, 200) overlap by 10 µs; #3 [320, 340) is nested in
    #2 [300, 400), 20 µs. Each launch goes to the latest-starting range holding it: 50 -> #0, 95 -> #1
    (the overlap), 150 -> #1, 330 -> #3 (inside the nest), 360 -> #2 (the outer one again)."""
    launches = {1: 50, 2: 95, 3: 150, 4: 330, 5: 360}
    ev = [tg.annotation("ProfilerStep#0", 0, 100), tg.annotation("ProfilerStep#1", 90, 110),
          tg.annotation("ProfilerStep#2", 300, 100), tg.annotation("ProfilerStep#3", 320, 20)]
    for corr, ts in launches.items():
        ev += [tg.launch(ts, 1, corr), tg.kernel(f"k{corr}", ts + 2, 1, corr)]
    path = tg.write(tmp_path / "overlap.json", tg.document(ev))
    tr = load_trace(path)
    steps = st.find_steps(tr, "ProfilerStep")
    assert steps["overlap_us"].tolist() == [10.0, 0.0, 20.0, 0.0]
    assert steps["dur_us"].tolist() == [100.0, 110.0, 100.0, 20.0]  # wall times as recorded
    by_kernel = dict(zip(tr.gpu["name"], st.assign_steps(tr, "ProfilerStep").tolist()))
    assert by_kernel == {"k1": 0, "k2": 1, "k3": 1, "k4": 3, "k5": 2}
    assert st.step_metrics(tr, "ProfilerStep")["kernels"].tolist() == [1, 2, 1, 1]
    note = ("2 of 4 steps marked 'ProfilerStep' overlap the next step on their thread, by up to 20.000 µs "
            "(30.000 µs in all): each CPU call and its kernels count in the latest-starting step holding the "
            "call, never in two; step wall times are the ranges as recorded")
    assert overlap_note(steps, "ProfilerStep") == note
    # Once per file, among the file's other warnings: the JSON's list and the text report's "warning:" lines.
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", str(path), "--format", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["files"][0]["warnings"].count(note) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", str(path)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0 and r.stdout.count(f"warning: {note}") == 1, r.stdout
    assert overlap_note(st.find_steps(tr, "ProfilerStep#0"), "ProfilerStep#0") is None  # one step alone


# --- timestamps beyond 2^53 µs (ns written as µs, a large epoch) --------------------------------------------------

HUGE_OFFSET = 1695835542514261000  # ~1.7e18 µs: float64 spacing there is 256 µs


def _two_step_events(off: int) -> list[dict]:
    """Steps [90, 150) and [150, 210); kernels a [100, 110], b [120, 140], a [160, 170], b [180, 200], all ``+ off``."""
    ev = [tg.annotation("bubblescope.decode_step#0", 90 + off, 60), tg.annotation("bubblescope.decode_step#1", 150 + off, 60)]
    for corr, (launch_ts, ts, dur) in enumerate([(95, 100, 10), (112, 120, 20), (155, 160, 10), (172, 180, 20)], 1):
        ev += [tg.launch(launch_ts + off, 2, corr), tg.kernel("ab"[(corr - 1) % 2], ts + off, dur, corr)]
    return tg.meta_events() + ev


@pytest.mark.parametrize("workers", ["0", "2"])
def test_timestamps_beyond_2_53_us_give_the_same_metrics_as_small_ones(tmp_path, monkeypatch, workers):
    """ts ~1.7e18 gave busy 0.0 µs, span 256 µs, bubble ratio 1.000 (float64 rounds to 256 µs there): integer
    timestamps are now rebased exactly onto the trace's smallest ts. By hand: busy 10 + 20 + 10 + 20 = 60 µs,
    span 100 .. 200 = 100 µs, bubble ratio 1 - 60/100 = 0.4; per step 2 kernels, 30 µs busy, 60 µs wall."""
    monkeypatch.setenv("BUBBLESCOPE_TRACE_WORKERS", workers)  # in process, and through worker processes
    small = tg.write(tmp_path / "small.json", tg.document(_two_step_events(0)))
    huge = tg.write(tmp_path / "huge.json", tg.document(_two_step_events(HUGE_OFFSET)))
    files = summarize_traces([small, huge])["files"]
    for f in files:
        (dev,) = f["devices"]
        assert (dev["busy_us"], dev["span_us"], dev["bubble_ratio"]) == (60.0, 100.0, pytest.approx(0.4))
        s = f["steps"]
        assert (s["steps"], s["kernels_per_step"], s["gpu_busy_us_per_step"], s["step_wall_us"]) == (2, 2, 30.0, 60.0)
        assert s["bubble_ratio"] == pytest.approx(0.4)
        assert not any("2^53" in w for w in f["warnings"])
    strip = lambda f: {k: v for k, v in f.items() if k != "path"}  # noqa: E731
    assert strip(files[0]) == strip(files[1])
    trace = load_trace(huge)
    assert trace.gpu["ts_us"].tolist() == [10.0, 30.0, 70.0, 90.0]  # from the smallest ts, the first step's 90


def test_huge_rank_traces_keep_their_cross_rank_skew(tmp_path):
    """Rank 1 starts 7 µs after rank 0, both at ~1.7e18 µs: each trace is rebased on its own smallest ts, then
    both are put on one origin, so the start skew is 7 µs, not 0 (or 256)."""
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    a = tg.write(tmp_path / "rank0.json", tg.document(_two_step_events(HUGE_OFFSET), rank=0))
    b = tg.write(tmp_path / "rank1.json", tg.document(_two_step_events(HUGE_OFFSET + 7), rank=1))
    ranks = summarize_rank_traces([a, b])["ranks"]
    assert [s["start_skew_us"] for s in ranks["per_step"]] == [7.0, 7.0]
    assert [s["end_skew_us"] for s in ranks["per_step"]] == [7.0, 7.0]
