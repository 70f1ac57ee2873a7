"""Schema bubblescope.results/1: validation, loading, atomic writing."""

from __future__ import annotations

import gzip
import json
import math
import os
import stat

import pytest

from . import resultsgen as g
from bubblescope.errors import BubblescopeError
from bubblescope.reports.results import SCHEMA, Results, load_results, ordered, validate_results, write_results

# Required keys, typed from docs/results-schema.md, not read from the code.
REQUIRED = (
    [k for k in "schema created command versions device model workload engines findings".split()]
    + ["versions.bubblescope"]
    + [f"device.{k}" for k in "type name sm_count l2_bytes nvml_peak_GBps copy_GBps max_sm_clock_MHz "
       "max_mem_clock_MHz bus_width_bits notes".split()]
    + [f"model.{k}" for k in "name source path parameters weight_bytes dtype config".split()]
    + [f"workload.{k}" for k in "prompt_len gen_len runs warmup context_sweep seed".split()]
    + [f"engines[0].{k}" for k in "name description status reason latency bandwidth timeline intrakernel "
       "compile correctness sweep trace_path".split()]
    + [f"engines[0].latency.{k}" for k in "ttft_ms token_ms_mean token_ms_p50 token_ms_p90 token_ms_p99 "
       "tok_per_s decode_share token_ms_samples ttft_ms_samples".split()]
    + [f"engines[0].bandwidth.{k}" for k in "bytes_per_step kv_bytes_per_step effective_GBps util_peak "
       "util_copy".split()]
    + [f"engines[1].timeline.{k}" for k in "available reason steps device kernels_per_step launches_per_step "
       "launches_per_s bubble_ratio bubble_ratio_steps launch_share sync_share gpu_busy_us_per_step "
       "step_wall_us idle launch_delay_us top_kernels categories max_registers_per_thread step_timeline".split()]
    + [f"engines[1].timeline.idle.{k}" for k in "host_wait_us kernel_wait_us other_us threshold_us".split()]
    + [f"engines[1].timeline.launch_delay_us.{k}" for k in ("p50", "p90", "max")]
    + [f"engines[1].timeline.top_kernels[0].{k}" for k in "name category count total_us share".split()]
    + [f"engines[1].timeline.categories[0].{k}" for k in "category count total_us share".split()]
    + [f"engines[1].timeline.step_timeline.kernels[0].{k}" for k in "name category stream start_us dur_us".split()]
    + [f"engines[1].timeline.step_timeline.launches[0].{k}" for k in "name start_us dur_us".split()]
    + ["engines[1].timeline.step_timeline.kernels", "engines[1].timeline.step_timeline.launches"]
    + [f"engines[0].intrakernel.{k}" for k in "wait_ratio programs tasks_per_step by_opcode tasks".split()]
    + [f"engines[0].intrakernel.by_opcode[0].{k}" for k in "opcode tasks busy_us wait_us".split()]
    + [f"engines[0].intrakernel.tasks[0].{k}" for k in "program opcode layer start_us ready_us end_us".split()]
    + [f"engines[0].compile.{k}" for k in "registers spills shared_bytes num_warps programs_per_sm grid".split()]
    + [f"engines[0].correctness.{k}" for k in "reference steps token_agreement max_abs_logit_diff "
       "rel_logit_err".split()]
    + [f"engines[0].sweep[0].{k}" for k in "context token_ms_p50 bytes_per_step kv_bytes_per_step effective_GBps "
       "util_peak".split()]
    + [f"findings[0].{k}" for k in "rule severity engine title evidence advice".split()]
)


def _doc_with_finding() -> dict:
    doc = g.healthy_doc()
    doc["findings"] = [g.a_finding()]
    return doc


def test_hand_built_documents_are_valid():
    assert validate_results(g.healthy_doc()) == []
    assert validate_results(g.null_metrics_doc()) == []
    assert validate_results(_doc_with_finding()) == []


@pytest.mark.parametrize("path", REQUIRED)
def test_each_missing_required_key_is_reported(path):
    doc = _doc_with_finding()
    container, key = g.locate(doc, path)
    del container[key]
    assert f"{path}: missing" in validate_results(doc)


@pytest.mark.parametrize("path, value, expected", [
    ("engines[0].latency.token_ms_p50", "0.8", "expected a finite number > 0"),
    ("engines[0].latency.token_ms_p50", 0, "0 is not a measurement: use null"),
    ("engines[0].bandwidth.effective_GBps", math.nan, "expected a finite number > 0"),
    ("engines[0].bandwidth.util_peak", -0.1, "expected a finite number >= 0"),
    ("engines[1].timeline.bubble_ratio", 1.5, "expected a fraction in [0, 1]"),
    ("engines[1].timeline.available", "yes", "expected true or false"),
    ("engines[0].status", "done", "expected one of 'ok', 'skipped', 'failed'"),
    ("device.type", "gpu", "expected one of 'cuda', 'cpu'"),
    ("model.source", "gguf", "expected one of 'dummy', 'hf', 'llama2c'"),
    ("workload.gen_len", 12.5, "expected an integer >= 0"),
    ("workload.runs", True, "expected an integer >= 0"),
    ("workload.context_sweep", [128, "1k"], "expected a list, each item an integer >= 0"),
    ("engines[0].latency.token_ms_samples", [0.8, None], "expected a list, each item a finite number > 0"),
    ("findings[0].evidence", {"bubble_ratio": "high"}, "expected an object, each value a finite number"),
    ("findings[0].severity", "error", "expected one of 'info', 'warn', 'problem', 'good'"),
    ("engines", {"megakernel": {}}, "expected a list"),
    ("engines[0].compile", [], "expected an object"),
    ("model.name", None, "expected a string, got null"),
    ("created", "yesterday", "expected an ISO-8601 timestamp"),
    ("schema", "bubblescope.results/2", "schema: expected 'bubblescope.results/1'"),
])
def test_wrong_type_or_range_is_reported(path, value, expected):
    doc = _doc_with_finding()
    container, key = g.locate(doc, path)
    container[key] = value
    problems = validate_results(doc)
    assert any(p.startswith(f"{path}:") and expected in p for p in problems), problems


def test_zero_is_accepted_where_it_is_a_real_measurement():
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["timeline"]["bubble_ratio"] = 0
    mk["compile"]["spills"] = 0
    mk["bandwidth"]["kv_bytes_per_step"] = 0
    mk["correctness"]["token_agreement"] = 0.0
    assert validate_results(doc) == []


def test_cross_field_rules():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["latency"] = None
    g.engine(doc, "hf")["reason"] = None
    g.engine(doc, "reference-cudagraph")["latency"]["token_ms_p99"] = 1.0  # below its p50 of 1.1
    doc["engines"].append(dict(g.engine(doc, "hf"), reason="again"))
    problems = validate_results(doc)
    assert "engines[0].latency: an engine with status 'ok' must report latency" in problems
    assert "engines[2].reason: a skipped engine must give a reason" in problems
    assert "engines[1].latency: token_ms_p90 1.12 exceeds token_ms_p99 1.0" in problems
    assert "engines[4].name: duplicate engine name 'hf'" in problems


def test_non_object_document_and_extra_keys():
    assert validate_results([1, 2]) == ["document: expected an object, got list"]
    doc = g.healthy_doc()
    doc["future_field"] = {"anything": 1}
    g.engine(doc, "megakernel")["latency"]["token_ms_p999"] = 0.9
    assert validate_results(doc) == []


def test_write_then_load_round_trip(tmp_path):
    doc = g.healthy_doc()
    path = write_results(Results(doc), tmp_path / "r.json")
    loaded = load_results(path)
    assert loaded.doc == doc
    assert loaded.engine("megakernel")["latency"]["token_ms_p50"] == 0.8
    assert [e["name"] for e in loaded.ok_engines] == ["megakernel", "reference-cudagraph"]
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_write_refuses_invalid_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_results(g.healthy_doc(), path)
    before = path.read_bytes()
    bad = g.healthy_doc()
    g.engine(bad, "megakernel")["latency"]["token_ms_p50"] = math.inf
    with pytest.raises(ValueError, match="token_ms_p50"):
        write_results(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_write_into_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(BubblescopeError, match="cannot write here"):
        write_results(g.healthy_doc(), tmp_path / "no" / "such" / "r.json")


@pytest.mark.parametrize("content, message", [
    (None, "no such results file"),
    ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ('{"schema": "other/1"}', "not a bubblescope results document (schema 'other/1'"),
    ("[1, 2]", "not a bubblescope results document (schema None"),
    ('{"schema": "bubblescope.results/1"}', "invalid results document: created: missing (and 7 more problems)"),
])
def test_load_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BubblescopeError) as info:
        load_results(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and message in text


def test_unknown_engine_and_ladder_order():
    res = Results(g.healthy_doc())
    with pytest.raises(BubblescopeError, match=r"engine 'nope': not in the results \(engines: megakernel, "):
        res.engine("nope")
    names = [e["name"] for e in ordered(res.engines + [{"name": "custom"}, {"name": "reference"}])]
    assert names == ["reference", "reference-cudagraph", "reference-compile", "hf", "megakernel", "custom"]


def test_load_survives_hostile_documents(tmp_path):
    """Values that once raised from inside validation (not a one-line error): an integer beyond float
    range where a number belongs, an unhashable engine name, JSON nested past the recursion limit."""
    huge = g.healthy_doc()
    huge["engines"][0]["latency"]["token_ms_p99"] = 10**400
    named = g.healthy_doc()
    named["engines"][0]["name"] = ["reference"]
    cases = {
        "huge.json": (json.dumps(huge), "engines[0].latency.token_ms_p99: expected a finite number > 0"),
        "named.json": (json.dumps(named), "engines[0].name: expected a string, got list"),
        "deep.json": ('{"schema": "bubblescope.results/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                      "JSON nested too deeply"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(BubblescopeError) as info:
            load_results(tmp_path / name)
        assert "\n" not in str(info.value) and str(tmp_path / name) in str(info.value) and message in str(info.value)


def test_load_gzip_by_content_bom_and_bad_bytes(tmp_path):
    text = json.dumps(g.healthy_doc())
    renamed = tmp_path / "archive.json"  # gzip without the .gz suffix
    renamed.write_bytes(gzip.compress(text.encode()))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    for path in (renamed, bom):
        assert load_results(path).doc == g.healthy_doc()
    data = gzip.compress(text.encode())
    for name, raw, message in (
        ("corrupt.json.gz", data[:20] + bytes(b ^ 0xFF for b in data[20:60]) + data[60:], "corrupt or truncated gzip"),
        ("cut.json.gz", data[: len(data) // 2], "corrupt or truncated gzip"),
        ("latin1.json", text.replace("megakernel", "m\xe9gakernel", 1).encode("latin-1"), "not UTF-8 text"),
    ):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(BubblescopeError) as info:
            load_results(tmp_path / name)
        assert "\n" not in str(info.value) and message in str(info.value)


def test_write_refuses_a_directory_or_device_path(tmp_path):
    """os.replace onto a directory raised a traceback; onto a device (as root) it replaced the device
    node. A FIFO stands in for the device: a regression must not be able to clobber /dev/null."""
    (tmp_path / "taken").mkdir()
    os.mkfifo(tmp_path / "pipe")
    for path in (tmp_path / "taken", tmp_path / "pipe"):
        with pytest.raises(BubblescopeError, match="exists and is not a regular file"):
            write_results(g.healthy_doc(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "taken"]
    assert not list((tmp_path / "taken").iterdir()) and stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode)


def test_diagnose_runs_a_repeated_engine_once(tmp_path):
    """``--engines reference,reference`` measured twice, then write_results refused the document
    (duplicate engine name) with a ValueError traceback after all the measuring."""
    from bubblescope.diagnosis import diagnose

    res = diagnose("tiny-llama", engines=["reference", "reference"], prompt_len=4, gen_len=4, runs=1, warmup=0,
                   context_sweep=[], device="cpu", out=tmp_path, profile_steps=2)
    assert [e["name"] for e in res.engines] == ["reference"] and res.engines[0]["status"] == "ok"
    assert [e["name"] for e in load_results(tmp_path / "results.json").engines] == ["reference"]
