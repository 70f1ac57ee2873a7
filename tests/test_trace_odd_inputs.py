"""Odd trace inputs of kinds seen in other people's traces, each built here by hand with its answer worked out
in the comments: ROCm's hip* API calls, ranges and calls written twice or nested in themselves, absolute
timestamps with nanosecond digits, and torch's legacy autograd-profiler export. Each trace is read by the
msgspec batch decoder and, switched off, by the per-event standard-library path, which must agree.
"""

from __future__ import annotations

import pytest

from bubblescope.profiler.trace import batch as tracebatch
from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.apis import cuda_api_name
from bubblescope.profiler.trace.steps import step_metrics

from . import tracegen as tg


@pytest.fixture(params=["batch", "per-event"])
def reader(request, monkeypatch):
    if request.param == "per-event":
        monkeypatch.setattr(tracebatch, "add_batch", lambda cols, text: False)
    return request.param


# --- ROCm ---------------------------------------------------------------------------------------------------------

def test_hip_names_are_their_cuda_counterparts():
    assert cuda_api_name("hipLaunchKernel") == "cudaLaunchKernel"
    assert cuda_api_name("hipExtLaunchKernel") == "cudaLaunchKernel"
    assert cuda_api_name("hipModuleLaunchKernel") == "cuLaunchKernel"
    assert cuda_api_name("hipGraphLaunch") == "cudaGraphLaunch"
    assert cuda_api_name("hipStreamSynchronize") == "cudaStreamSynchronize"
    assert cuda_api_name("hipMemcpyAsync") == "cudaMemcpyAsync"
    assert cuda_api_name("hipLaunchKernel_spt") == "cudaLaunchKernel"
    assert cuda_api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"  # CUDA names as before


def _rocm_step_events(names: dict[str, str]) -> list[dict]:
    """Two ProfilerStep ranges of a ROCm trace (Kineto's roctracer writes hip* calls as cuda_runtime).

    Step 0 [0, 100): a launch (corr 1, k1 [20, 30]), a module launch (corr 2, k2 [30, 35]), an ext launch
    (corr 3, k3 [40, 42]), a memcpy call (corr 4, 1 KiB copy [45, 46]), a stream sync [50, 60) of 10 µs.
    Step 1 [100, 200): one graph launch (corr 5) replaying g1 [120, 125] and g2 [126, 130], a device sync
    [140, 160) of 20 µs. Launches: 3 and 1; kernels: 3 and 2; sync µs: 10 and 20.
    """
    n = names
    return [
        tg.annotation("ProfilerStep#0", 0, 100), tg.annotation("ProfilerStep#1", 100, 100),
        tg.api(n["launch"], 10, 2, 1), tg.kernel("k1", 20, 10, 1),
        tg.api(n["module"], 12, 2, 2), tg.kernel("k2", 30, 5, 2),
        tg.api(n["ext"], 14, 2, 3), tg.kernel("k3", 40, 2, 3),
        tg.api(n["copy"], 16, 2, 4), tg.memcpy(45, 1, 4),
        tg.api(n["stream_sync"], 50, 10, 6),
        tg.api(n["graph"], 110, 5, 5), tg.kernel("g1", 120, 5, 5), tg.kernel("g2", 126, 4, 5),
        tg.api(n["device_sync"], 140, 20, 7),
    ]


HIP = {"launch": "hipLaunchKernel", "module": "hipModuleLaunchKernel", "ext": "hipExtLaunchKernel",
       "copy": "hipMemcpyAsync", "stream_sync": "hipStreamSynchronize", "graph": "hipGraphLaunch",
       "device_sync": "hipDeviceSynchronize"}


def test_hip_launch_and_sync_calls_count_as_cuda_ones(tmp_path, reader):
    """hipLaunchKernel & co. were no launch and hipStreamSynchronize no sync: 0 launches per step and no sync
    time on an AMD GPU's trace."""
    metrics = step_metrics(load_trace(tg.write(tmp_path / "rocm.json", tg.document(_rocm_step_events(HIP)))),
                           "ProfilerStep")
    assert metrics["launches"].tolist() == [3, 1]
    assert metrics["kernels"].tolist() == [3, 2]
    assert metrics["sync_us"].tolist() == [10.0, 20.0]
    assert metrics["launch_us"].tolist() == [6.0, 5.0]  # 2 µs per launch call in step 0, the 5 µs graph launch


def test_calls_that_only_look_like_launches_do_not_count(tmp_path, reader):
    """The same trace with made-up hip names (no such HIP API): nothing is a launch or a sync."""
    made_up = {k: f"hipNot{v[3:]}" for k, v in HIP.items()}
    metrics = step_metrics(load_trace(tg.write(tmp_path / "x.json", tg.document(_rocm_step_events(made_up)))),
                           "ProfilerStep")
    assert metrics["launches"].tolist() == [0, 0] and metrics["sync_us"].tolist() == [0.0, 0.0]


# --- written twice, nested in itself -----------------------------------------------------------------------------

def _steps_events() -> list[dict]:
    """Three steps of one launch and one kernel each: ProfilerStep#s [100 s, 100 s + 50), launch at +10
    (corr s + 1, 2 µs), kernel [+20, +30)."""
    ev = []
    for s in range(3):
        t = 100 * s
        ev += [tg.annotation(f"ProfilerStep#{s}", t, 50), tg.launch(t + 10, 2, s + 1),
               tg.kernel("k", t + 20, 10, s + 1)]
    return ev


def test_a_step_range_nested_in_itself_is_one_step(tmp_path, reader):
    """ProfilerStep#1 [100, 150) holds another ProfilerStep#1 [105, 140) (a schedule's range re-entered, a user
    record_function of the same name): it was counted as two steps, the inner one taking the launch. Now: three
    steps of one launch each, and a warning."""
    events = _steps_events() + [tg.annotation("ProfilerStep#1", 105, 35)]
    tr = load_trace(tg.write(tmp_path / "n.json", tg.document(events)))
    metrics = step_metrics(tr, "ProfilerStep")
    assert metrics["name"].tolist() == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert metrics["wall_us"].tolist() == [50.0, 50.0, 50.0] and metrics["launches"].tolist() == [1, 1, 1]
    assert "1 range (record_function) nested inside another of the same name on the same thread: counted once " \
           "(the outer one kept)" in tr.warnings


def test_ranges_and_calls_written_twice_count_once(tmp_path, reader):
    """Every event of step 1 written twice (same name, ts, dur, pid, tid): step 1 was two steps and its launch
    two launches. Counted once each, with a note per kind; the kernel's repeat is merged as before."""
    events = _steps_events()
    events += [e for e in events[3:6]]  # ProfilerStep#1, its launch and its kernel again
    tr = load_trace(tg.write(tmp_path / "d.json", tg.document(events)))
    metrics = step_metrics(tr, "ProfilerStep")
    assert len(metrics) == 3 and metrics["launches"].tolist() == [1, 1, 1] and metrics["kernels"].tolist() == [1, 1, 1]
    assert "1 range (record_function) repeated exactly (same thread, name, start and duration): counted once" \
        in tr.warnings
    assert "1 CPU API call repeated exactly (same thread, name, correlation id, start and duration): counted once" \
        in tr.warnings
    assert "1 GPU activity repeated exactly (same device, stream, name, start and duration): counted once" \
        in tr.warnings


def test_different_ranges_and_calls_are_all_kept(tmp_path, reader):
    """Must not fire: ranges of other names nested (ProfilerStep#1 in a user range "decode"), a range of the same
    name on another thread, and two launches at one time on two threads are all kept, without a note."""
    events = _steps_events() + [tg.annotation("decode", 90, 70), tg.annotation("ProfilerStep#1", 100, 50, tid=2),
                                tg.launch(110, 2, 9, tid=2)]
    tr = load_trace(tg.write(tmp_path / "k.json", tg.document(events)))
    assert len(tr.annotations) == 5 and len(tr.runtime) == 4
    assert not [w for w in tr.warnings if "counted once" in w]


# --- torch's legacy autograd-profiler export ---------------------------------------------------------------------

def _legacy_export(with_gpu: bool = True) -> str:
    """What ``torch.autograd.profiler.profile(use_cuda=True)``'s ``export_chrome_trace`` wrote (torch 1.x): a bare
    array; operators without a category on pid "CPU functions"; per kernel a flow start on the operator, a flow end
    and the kernel itself (no category) on pid "CUDA functions" with tid the device. Written as its format strings
    write it. Kernels: k1 [110, 130) and k2 [140, 150) on device 0 (busy 30 of a 40 µs span: bubble ratio 0.25),
    k3 [200, 205) on device 1."""
    ops = [("aten::mm", 100, 25, [("k1", 110, 20, 0)]), ("aten::add", 130, 12, [("k2", 140, 10, 0)]),
           ("aten::copy_", 190, 10, [("k3", 200, 5, 1)])]
    out, next_id = [], 0
    for name, ts, dur, kernels in ops:
        out.append(f'{{"name": "{name}", "ph": "X", "ts": {ts}, "dur": {dur}, "tid": 1, "pid": "CPU functions", '
                   '"args": {}}, ')
        for kname, kts, kdur, device in kernels if with_gpu else []:
            out.append(f'{{"name": "{name}", "ph": "s", "ts": {ts}, "tid": 1, "pid": "CPU functions", "id": '
                       f'{next_id}, "cat": "cpu_to_cuda", "args": {{}}}}, ')
            out.append(f'{{"name": "{kname}", "ph": "f", "ts": {kts}, "tid": {device}, "pid": "CUDA functions", '
                       f'"id": {next_id}, "cat": "cpu_to_cuda", "args": {{}}}}, ')
            out.append(f'{{"name": "{kname}", "ph": "X", "ts": {kts}, "dur": {kdur}, "tid": {device}, "pid": '
                       '"CUDA functions", "args": {}}, ')
            next_id += 1
    text = "[" + "".join(out)
    return text[:-2] + "]"  # as the exporter: the last ", " cut


def test_a_legacy_autograd_export_with_kernels_is_not_cpu_only(tmp_path, reader):
    """Its kernels have no category, so the trace read as "no GPU activity (CPU-only run)"."""
    from bubblescope.profiler.trace.summary import summarize_traces

    s = summarize_traces([tg.write(tmp_path / "legacy.json", _legacy_export())])["files"][0]
    devices = {d["device"]: d for d in s["devices"]}
    assert sorted(devices) == [0, 1]
    assert (devices[0]["kernels"], devices[0]["busy_us"], devices[0]["span_us"]) == (2, 30.0, 40.0)
    assert devices[0]["bubble_ratio"] == 0.25
    assert (devices[1]["kernels"], devices[1]["busy_us"]) == (1, 5.0)
    assert not [w for w in s["warnings"] if "CPU-only" in w]
    assert "3 kernels of a legacy autograd-profiler export (pid 'CUDA functions', no category) read as GPU kernels " \
           "of device tid, stream unknown; that format records no launch calls, so launch and per-step figures " \
           "are unavailable (a torch.profiler trace has them)" in s["warnings"]


def test_a_legacy_autograd_export_of_a_cpu_run_stays_cpu_only(tmp_path, reader):
    from bubblescope.profiler.trace.summary import summarize_traces

    s = summarize_traces([tg.write(tmp_path / "cpu.json", _legacy_export(with_gpu=False))])["files"][0]
    assert s["devices"] == [] and "no GPU activity in trace (CPU-only run)" in s["warnings"]
    assert not [w for w in s["warnings"] if "legacy" in w]


# --- absolute timestamps with ns digits --------------------------------------------------------------------------

BASE_US = 1733456789012345  # µs since the epoch (2024-12-06): float64's spacing there is 0.25 µs


def _abs(us: int, ns: int) -> str:
    """BASE_US + us µs + ns ns as Kineto writes it: µs with three decimals."""
    return f"{BASE_US + us}.{ns:03d}"


def _ns_trace(pairs: bool = False) -> str:
    """Two kernels on one stream, 1 ns apart, launched inside one step; times written by hand (json.dumps would
    round them through float first). Kernel a [+10.001, +11.001) µs (1.000 µs), b [+11.002, +12.003) (1.001 µs):
    span 2.002 µs, busy 2.001, idle 0.001 (1 ns); launch delays 3.001 and 3.502 µs (launches at +7.000 and
    +7.500). With ``pairs`` the step is a B/E pair [+0.000, +50.123)."""
    step = ('{"ph": "B", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": %s}, '
            '{"ph": "E", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": %s}'
            % (_abs(0, 0), _abs(50, 123)) if pairs else
            '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": %s, '
            '"dur": 50.123}' % _abs(0, 0))
    events = [
        step,
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": %s, "dur": 1.5, '
        '"args": {"correlation": 1}}' % _abs(7, 0),
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": %s, "dur": 1.5, '
        '"args": {"correlation": 2}}' % _abs(7, 500),
        '{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": %s, "dur": 1.000, '
        '"args": {"device": 0, "stream": 7, "correlation": 1}}' % _abs(10, 1),
        '{"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": %s, "dur": 1.001, '
        '"args": {"device": 0, "stream": 7, "correlation": 2}}' % _abs(11, 2),
    ]
    return '{"traceEvents": [' + ", ".join(events) + "]}"


@pytest.mark.parametrize("pairs", [False, True], ids=["complete", "begin-end"])
def test_absolute_ns_timestamps_keep_their_ns(tmp_path, reader, pairs):
    """Read as float64 µs, 1733456789012345.678 keeps 0.25 µs steps: the 1 ns gap vanished and a 1.001 µs kernel
    started 0.25 µs off. The ts are read from their text, rebased onto the trace's first whole µs."""
    from bubblescope.profiler.trace.steps import launch_delays
    from bubblescope.profiler.trace.summary import summarize_traces

    path = tg.write(tmp_path / "abs.json", _ns_trace(pairs))
    tr = load_trace(path)
    assert tr.gpu["ts_us"].tolist() == pytest.approx([10.001, 11.002], abs=1e-9)
    assert tr.gpu["end_us"].tolist() == pytest.approx([11.001, 12.003], abs=1e-9)
    assert launch_delays(tr)["delay_us"].tolist() == pytest.approx([3.001, 3.502], abs=1e-9)
    metrics = step_metrics(tr, "ProfilerStep")
    assert metrics["wall_us"].tolist() == pytest.approx([50.123], abs=1e-9)
    device = summarize_traces([path])["files"][0]["devices"][0]
    assert device["span_us"] == pytest.approx(2.002, abs=1e-9) and device["busy_us"] == pytest.approx(2.001, abs=1e-9)
    assert device["idle"]["idle_us"] == pytest.approx(0.001, abs=1e-9)


def test_relative_timestamps_are_read_as_before(tmp_path, reader):
    """Must not change: Kineto's usual relative µs (below 2^43) keep their float values, no rebase."""
    text = ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 5415637207958.532, '
            '"dur": 1.5, "args": {"device": 0, "stream": 7}}]}')
    tr = load_trace(tg.write(tmp_path / "rel.json", text))
    assert tr.gpu["ts_us"].tolist() == [5415637207958.532] and tr.gpu["end_us"].tolist() == [5415637207960.032]
