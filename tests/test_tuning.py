"""``bubblescope tune`` on the Triton megakernel under the CPU interpreter (tiny-llama, few tokens), the tuned
file, and ``--tuning`` picking the entry for the sequence length."""

from __future__ import annotations

import hashlib
from html import unescape
import json
import math
import os
import re

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from bubblescope.errors import BubblescopeError  # noqa: E402
from bubblescope.reports.tune_result import best_per_context, tuned_document  # noqa: E402
from bubblescope.tuned import engine_params, load_tuning  # noqa: E402
from bubblescope.tuning import knobs, parse_value, tune, unique_values  # noqa: E402

from .conftest import STORIES, needs_stories  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU test: the megakernel under the interpreter")


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def test_knob_list_and_value_parsing():
    names = {k["name"]: k for k in knobs("megakernel")}
    assert {"block_k", "max_rows", "rows_qkv", "programs_per_sm", "num_warps", "kv_splits", "block_s",
            "prefetch"} <= set(names)
    assert "timeline" not in names and "spin_cap" not in names  # switches, not knobs
    assert parse_value(names["kv_splits"], "auto") is None and parse_value(names["block_k"], "0x100") == 256
    assert parse_value(names["fast_launch"], "off") is False and parse_value(names["prefetch"], "line") == "line"
    with pytest.raises(ValueError, match="block_k takes an integer, got 'big'"):
        parse_value(names["block_k"], "big")
    r = _cli("tune", "--list")
    assert r.exit_code == 0 and ("megakernel, megakernel-gluon, megakernel-triton, megakernel-stages, "
                                 "megakernel-noprefetch (MegakernelParams); defaults on ") in " ".join(r.output.split())
    r = _cli("tune", "tiny-llama", "--knob", "warp_size", "--values", "1")
    assert r.exit_code == 2 and "error: --knob: megakernel has no knob 'warp_size'" in r.output
    r = _cli("tune", "tiny-llama", "--engine", "reference", "--knob", "block_k", "--values", "1")
    assert r.exit_code == 2 and "'reference' has no tuning knobs" in r.output


def test_tune_two_knobs_on_tiny_llama_with_invalid_values_as_rows(tmp_path):
    # Knob 1 through the library: one valid value, one that fails validation.
    doc = tune("tiny-llama", "block_k", ["64", "100"], [4, 8], steps=2)
    ok, bad = doc["rows"]
    assert doc["schema"] == "bubblescope.tune/1" and doc["family"] == "tile columns"
    assert (bad["status"], bad["reason"]) == ("invalid", "megakernel params: block_k must be a power of two, got 100")
    assert ok["status"] == "ok" and [p["context"] for p in ok["points"]] == [4, 8]
    for p in ok["points"]:
        assert 0 < p["token_ms_p50"] <= p["token_ms_p99"]
        assert p["token_agreement"] == 1.0          # the reference engine, teacher-forced, picks the same tokens
        assert 0 <= p["intrakernel_wait_ratio"] < 1  # from the kernel's own timestamps (interpreter: one program)
        assert p["util_peak"] is None               # CPU: no peak to compare with
    assert ok["compile"]["grid"] == 1 and ok["compile"]["registers"] is None
    assert doc["base_params"]["max_rows"] == 512 and "block_k" not in doc["base_params"]  # CPU_PARAMS

    # Knob 2 through the CLI: the output files, --save, and an invalid value as a row.
    out = tmp_path / "out"
    r = _cli("tune", "tiny-llama", "--knob", "kv_splits", "--values", "1,2,0", "--contexts", "4,8", "--steps", "2",
             "--out", out, "--save", tmp_path / "tuned.json")
    assert r.exit_code == 0, r.output
    assert "kv_splits=0: invalid: megakernel params: kv_splits must be a positive integer, got 0" in r.output
    doc2 = json.loads((out / "tune.json").read_text())
    assert [row["status"] for row in doc2["rows"]] == ["ok", "ok", "invalid"]
    html = (out / "tune.html").read_text()
    assert "data:image/png;base64," in html and "kv_splits must be a positive integer" in html
    # `tune --list` printed the class defaults (max_rows 8) while this CPU page held max_rows=512: now both show
    # what tune holds on the device, None as "auto"
    listed = dict(re.findall(r"^  (\w+)\s+.*?default (\S+)", _cli("tune", "--list", "--device", "cpu").output, re.M))
    page = {k: unescape(v) for k, v in re.findall(r"<tr><td>(\w+)</td><td>([^<]*)</td></tr>", html)}
    assert page["max_rows"] == listed["max_rows"] == "512" and page["rows_qkv"] == listed["rows_qkv"] == "auto"
    assert {k: v for k, v in page.items() if k in listed} == {k: listed[k] for k in page if k in listed}
    assert all(len(p["token_ms_samples"]) == 2 for row in doc2["rows"] if row["status"] == "ok"
               for p in row["points"])  # every timed step kept: the noise "best" is judged against
    # best = the lowest recorded p50 per context; the tuned ranges split at the geometric mean of 4 and 8.
    for b in doc2["best"]:
        p50s = {row["value"]: p["token_ms_p50"] for row in doc2["rows"] if row["status"] == "ok"
                for p in row["points"] if p["context"] == b["context"]}
        assert b["value"] == min(p50s, key=p50s.get)
    tuned = json.loads((tmp_path / "tuned.json").read_text())
    assert [r["max_context"] for r in tuned["ranges"]] == [int(math.sqrt(4 * 8)), None]
    assert [r["params"]["kv_splits"] for r in tuned["ranges"]] == [b["value"] for b in doc2["best"]]
    # The model's identity travels with the file (checked by --tuning): the hash of its HF config dict.
    from bubblescope.models import get_preset
    expected = hashlib.sha256(json.dumps(get_preset("tiny-llama").to_hf_dict(), sort_keys=True).encode()).hexdigest()
    assert tuned["model"]["config_sha256"] == expected and tuned["model"]["name"] == "tiny-llama"


def test_a_value_that_fails_to_build_is_a_row_not_a_crash(monkeypatch):
    import bubblescope.engines as engines
    real = engines.build_engine

    def build(name, weights, max_seq_len, params=None):
        if params is not None and params.block_s == 4:
            raise RuntimeError("triton.runtime.errors.OutOfResources: out of resource: shared memory\nRequired: 1")
        return real(name, weights, max_seq_len, params=params)
    monkeypatch.setattr(engines, "build_engine", build)
    doc = tune("tiny-llama", "block_s", ["4"], [4], steps=1)
    assert doc["rows"][0]["status"] == "failed"
    assert doc["rows"][0]["reason"] == "does not build: RuntimeError: triton.runtime.errors.OutOfResources: out of " \
                                       "resource: shared memory"
    assert doc["best"] == []
    with pytest.raises(BubblescopeError, match="no value of the knob ran ok"):
        tuned_document(doc)


def _tuned_file(tmp_path, ranges, model=None):
    """A tuned file; without ``model``, as bubblescope wrote them before the config hash (no identity)."""
    path = tmp_path / "tuned.json"
    doc = {"schema": "bubblescope.tuned/1", "engine": "megakernel", "knob": "kv_splits", "ranges": ranges}
    path.write_text(json.dumps(doc if model is None else {**doc, "model": model}))
    return path


def test_a_tuned_file_for_another_model_is_refused(tmp_path):
    """QA finding: a file tuned for llama-3.2-1b was applied to tiny-llama without a word."""
    from bubblescope.diagnosis import diagnose
    from bubblescope.models import get_preset

    other = get_preset("llama-3.2-1b")
    path = _tuned_file(tmp_path, [{"max_context": None, "params": {"kv_splits": 1}}],
                       model={"name": "llama-3.2-1b", "config_sha256": other.config_sha256()})
    tiny = get_preset("tiny-llama")
    message = (f"--tuning {path}: tuned for llama-3.2-1b (config {other.config_sha256()[:12]}), not for tiny-llama "
               f"(config {tiny.config_sha256()[:12]}); run `bubblescope tune` on this model with --save")
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--engine", "megakernel",
             "--tuning", path)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"error: {message}"]
    out = tmp_path / "out"
    r = _cli("diagnose", "model", "tiny-llama", "--engines", "megakernel", "--tuning", path, "--out", out)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"error: {message}"]
    assert not out.exists()
    with pytest.raises(BubblescopeError, match="tuned for llama-3.2-1b"):
        diagnose("tiny-llama", engines=["reference"], write=False, tuning=str(path))
    # The same config under another name (a checkpoint folder of the preset) is the same model.
    assert load_tuning(path).check_model(other.replace(name="my-folder")) is None
    # A file without a model section (older bubblescope) still loads, with a warning naming the gap.
    old = load_tuning(_tuned_file(tmp_path, [{"max_context": None, "params": {"kv_splits": 1}}]))
    assert "does not record which model it was tuned for" in old.check_model(tiny)
    with pytest.raises(BubblescopeError, match="model must be an object"):
        load_tuning(_tuned_file(tmp_path, [{"max_context": None, "params": {"kv_splits": 1}}], model="x"))


def test_tuning_picks_the_entry_for_the_length(tmp_path):
    from bubblescope.engines import build_engine
    from bubblescope.models import dummy_weights, get_preset

    t = load_tuning(_tuned_file(tmp_path, [{"max_context": 16, "params": {"kv_splits": 1}},
                                           {"max_context": None, "params": {"kv_splits": 2}}]))
    w = dummy_weights(get_preset("tiny-llama"))
    for length, splits in ((10, 1), (16, 1), (17, 2), (40, 2)):
        params, rec = engine_params(t, "megakernel", length, "cpu")
        assert rec["params"] == {"kv_splits": splits}
        eng = build_engine("megakernel", w, 48, params=params)
        assert eng.compile_info()["tiling"]["kv_splits"] == splits  # the engine really runs with it
    params, rec = engine_params(t, "reference", 10, "cpu")
    assert params is None and rec["reason"] == "the file tunes megakernel, not reference"
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(BubblescopeError, match="not a bubblescope tuned file"):
        load_tuning(tmp_path / "x.json")
    for key, value, shown in (("knob", ["kv_splits"], '["kv_splits"]'), ("engine", 5, "5")):  # knob: a TypeError
        (tmp_path / "x.json").write_text(json.dumps({**json.loads(_tuned_file(tmp_path, []).read_text()), key: value}))
        with pytest.raises(BubblescopeError, match=re.escape(f"x.json: {key} must be a string, got {shown}")):
            load_tuning(tmp_path / "x.json")
    (tmp_path / "x.json").write_text("null")  # was "(schema 'NoneType', ...)": Python's name for JSON null
    with pytest.raises(BubblescopeError, match=r"not a bubblescope tuned file \(a JSON null, not an object; "
                                               r"expected schema 'bubblescope.tuned/1'"):
        load_tuning(tmp_path / "x.json")
    r = _cli("generate", "tiny-llama", "--engine", "megakernel", "--tuning", tmp_path / "missing.json")
    assert r.exit_code == 2 and "--tuning" in r.output and "no such file" in r.output


@pytest.mark.parametrize("ranges, message", [
    ([{"max_context": None, "params": {"kv_splits": 1}}, {"max_context": 16, "params": {"kv_splits": 2}}],
     "ranges[0].max_context: must be a positive integer (only the last range is open-ended, null), got null"),
    ([{"max_context": 100, "params": {}}, {"max_context": 10, "params": {}}],  # out of order, the last one closed
     "ranges[1].max_context: the last range must be open-ended (null), got 10"),
    ([{"max_context": 100, "params": {}}, {"max_context": 10, "params": {}}, {"max_context": None, "params": {}}],
     "ranges[1].max_context: ranges must be in increasing order, got 10 after 100"),
    ([{"max_context": 16, "params": {}}, {"max_context": 16, "params": {}}, {"max_context": None, "params": {}}],
     "ranges[1].max_context: ranges must be in increasing order, got 16 after 16"),
    ([{"max_context": 0, "params": {}}, {"max_context": None, "params": {}}],
     "ranges[0].max_context: must be a positive integer (only the last range is open-ended, null), got 0"),
    ([{"max_context": -5, "params": {}}],
     "ranges[0].max_context: the last range must be open-ended (null), got -5"),
    ([{"max_context": 8, "params": {}}, {"max_context": None, "params": {"block_k": 128, "nope": 1}}],
     "ranges[1].params: unknown knob 'nope' for megakernel (see `bubblescope tune --list`)"),
    ([{"max_context": None, "params": {"block_k": 2 ** 40}}],
     "ranges[0].params: megakernel params: block_k must be at most 2**20 = 1048576 (Triton's largest block), got "
     "1099511627776"),
    ([{"max_context": None, "params": {"spin_sleep_ns": 2 ** 31}}],
     "ranges[0].params: megakernel params: spin_sleep_ns must fit in 32 bits (below 2**31), got 2147483648"),
    ([{"max_context": None, "params": {"num_warps": 0}}],
     "ranges[0].params: megakernel params: num_warps must be a power of two, got 0"),
    ([], "ranges: must be a non-empty list of {max_context, params}, got []"),
])
def test_tuned_ranges_and_values_out_of_bounds_are_refused_naming_the_field(tmp_path, ranges, message):
    """Ranges out of order or closed at the end, a max_context <= 0, an unknown knob and values the
    megakernel cannot take (block_k 2**40 ran) were taken, or refused without naming the field."""
    with pytest.raises(BubblescopeError) as info:
        load_tuning(_tuned_file(tmp_path, ranges))
    assert str(info.value) == f"--tuning {tmp_path / 'tuned.json'}: {message}"


@pytest.mark.parametrize("params, message", [
    ({"kv_splits": True}, "ranges[0].params.kv_splits: must be int | None, got true"),      # was taken as kv_splits 1
    ({"block_k": True}, "ranges[0].params.block_k: must be int, got true"),                # was a traceback in the interpreter
    ({"fast_launch": "no"}, 'ranges[0].params.fast_launch: must be bool, got "no"'),       # was taken as on
    ({"prefetch": 5}, "ranges[0].params.prefetch: must be str, got 5"),
])
def test_tuned_values_of_the_wrong_json_type_are_one_line_errors(tmp_path, params, message):
    with pytest.raises(BubblescopeError) as info:
        load_tuning(_tuned_file(tmp_path, [{"max_context": None, "params": params}]))
    assert str(info.value) == f"--tuning {tmp_path / 'tuned.json'}: {message}"
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--engine", "megakernel",
             "--tuning", tmp_path / "tuned.json")
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"error: {info.value}"]
    assert load_tuning(_tuned_file(tmp_path, [{"max_context": None, "params": {"kv_splits": None}}]))


@needs_stories
def test_generate_and_diagnose_take_tuning(tmp_path):
    path = _tuned_file(tmp_path, [{"max_context": 16, "params": {"kv_splits": 1}},
                                  {"max_context": None, "params": {"kv_splits": 2}}])
    r = _cli("generate", STORIES, "--engine", "megakernel", "--prompt-ids", "1,403", "--max-new-tokens", "3",
             "--tuning", path)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert f"warning: --tuning {path}: the file does not record which model it was tuned for (written before " \
           "bubblescope stored the config hash): applied to stories260k unchecked" in lines
    assert f"--tuning {path}: megakernel takes kv_splits=1 (entry up to length 16; this run's length 5)" in lines
    from bubblescope.diagnosis import diagnose
    res = diagnose(str(STORIES), engines=["megakernel"], prompt_len=12, gen_len=8, runs=1, warmup=0,
                   context_sweep=[], profile_steps=1, write=False, tuning=str(path))
    eng = res.engines[0]
    assert eng["status"] == "ok", eng["reason"]
    assert eng["tuning"]["params"] == {"kv_splits": 2} and eng["tuning"]["length"] == 20
    assert eng["compile"]["tiling"]["kv_splits"] == 2
    assert (f"--tuning {path}: megakernel takes kv_splits=2 (last, open-ended entry; this run's length 20)"
            in res.doc["device"]["notes"])


def test_cliffs_are_named_and_circled():
    """A hand-made GPU-like document: one value spills, one loses residency (2 of 4 programs per SM)."""
    from bubblescope.reports.tune_report import cliff, render_tune_html, tune_figure

    def row(v, spills, per_sm, ms):
        return {"value": v, "text": str(v), "status": "ok", "reason": None,
                "compile": {"registers": 128, "spills": spills, "shared_bytes": 0, "programs_per_sm": per_sm,
                            "requested_programs_per_sm": 4, "grid": 132 * per_sm},
                "points": [{"context": 128, "token_ms_p50": ms, "token_ms_p99": ms * 1.1, "util_peak": 0.4,
                            "intrakernel_wait_ratio": 0.3, "token_agreement": 1.0}]}
    doc = {"engine": "megakernel", "knob": "block_k", "family": "tile columns", "contexts": [128], "steps": 8,
           "model": {"name": "llama-3.2-1b", "dtype": "bfloat16"}, "device": {"type": "cuda", "name": "H200"},
           "command": "bubblescope tune", "created": "now", "base_params": {"num_warps": 4},
           "rows": [row(256, 0, 4, 1.2), row(512, 6, 4, 1.3), row(2048, 0, 2, 1.9)]}
    doc["best"] = best_per_context(doc)
    # no samples in this document: the lead over 512 (0.1 ms) cannot be weighed against a noise
    assert doc["best"] == [{"context": 128, "value": 256, "text": "256", "token_ms_p50": 1.2, "runner_up": "512",
                            "lead_ms": pytest.approx(0.1), "noise_ms": None, "within_noise": None}]
    assert [cliff(r) for r in doc["rows"]] == [None, "6 spilled words", "2 of 4 programs per SM resident"]
    fig = tune_figure(doc)
    circled = [c for c in fig.axes[0].collections if c.get_label() == "spills / lost residency"]
    assert len(circled) == 1 and circled[0].get_offsets().tolist() == [[512, 1.3], [2048, 1.9]]
    html = render_tune_html(doc)
    assert "block_k=512: 6 spilled words" in html and "<td>1.200</td>" in html


def _tune_doc(compile_info: dict, util_peak) -> dict:
    point = {"context": 4096, "token_ms_p50": 1.234, "token_ms_p99": 12.345, "util_peak": util_peak,
             "intrakernel_wait_ratio": 0.271, "token_agreement": 1.0}
    return {"engine": "megakernel", "knob": "programs_per_sm", "family": "residency", "steps": 3,
            "model": {"name": "llama-3.2-1b", "dtype": "bfloat16"}, "device": {"name": "NVIDIA H200", "type": "cuda"},
            "rows": [{"text": "16", "value": 16, "status": "ok", "points": [point], "compile": compile_info}],
            "best": [{"context": 4096, "text": "16", "token_ms_p50": 1.234}]}


def test_tune_table_fits_80_columns_without_cutting_numbers():
    """At 80 columns the twelve-column table cut every cell to "330.…"; a GPU row must print whole, and a CPU
    run leaves out (and names) the columns nobody measured."""
    from rich.console import Console

    from bubblescope.reports.tune_report import render_tune

    gpu = _tune_doc({"registers": 168, "spills": 12, "shared_bytes": 101376, "programs_per_sm": 3,
                     "requested_programs_per_sm": 4, "grid": 396}, 0.555)
    console = Console(width=80, record=True)
    render_tune(gpu, console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    row = next(line for line in text.splitlines() if line.lstrip().startswith("16 "))
    assert row.split() == ["16", "4096", "1.234", "12.345", "55.5", "%", "27.1", "%", "100.0", "%", "168", "12",
                           "101376", "3", "396"]
    assert "not measured" not in text

    cpu = _tune_doc({"registers": None, "spills": None, "shared_bytes": None, "programs_per_sm": None,
                     "grid": 1}, None)
    console = Console(width=80, record=True)
    render_tune(cpu, console)
    text = console.export_text()
    assert "…" not in text
    assert "not measured (columns left out): % peak, regs, spills, smem B, progs/SM" in text


@pytest.mark.parametrize("save, why", [("dir", "exists and is not a regular file"),
                                       ("missing/tuned.json", "no such directory '{tmp}/missing'")])
def test_an_unusable_save_path_is_refused_before_measuring(tmp_path, save, why):
    """A --save path that cannot be written failed only after the whole tuning run, with tune.json and
    tune.html already written and exit 2; now it is refused first and nothing is written."""
    (tmp_path / "dir").mkdir()
    out = tmp_path / "out"
    r = _cli("tune", "tiny-llama", "--knob", "kv_splits", "--values", "1", "--contexts", "4", "--steps", "1",
             "--out", out, "--save", tmp_path / save)
    assert r.exit_code == 2 and r.output.startswith(f"error: --save {tmp_path / save}: ")
    assert why.replace("{tmp}", str(tmp_path)) in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()


def test_an_output_taken_by_a_directory_is_refused_before_measuring(tmp_path):
    (tmp_path / "out" / "tune.html").mkdir(parents=True)
    r = _cli("tune", "tiny-llama", "--knob", "kv_splits", "--values", "1", "--contexts", "4", "--steps", "1",
             "--out", tmp_path / "out")
    taken = tmp_path / "out" / "tune.html"
    assert r.exit_code == 2
    assert r.output.strip() == f"error: --out {tmp_path / 'out'}: {taken} exists and is not a regular file"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tune.html"]


def test_a_tune_where_no_value_ran_is_an_error_and_leaves_out_and_save_as_they_were(tmp_path):
    """`tune --values nope --out ts --save ts.json` exited 2 (nothing to save) after replacing ts/tune.json and
    tune.html; without --save it exited 0 with a table of nothing."""
    out, save = tmp_path / "ts", tmp_path / "ts.json"
    out.mkdir()
    for name, text in [("tune.json", "old json"), ("tune.html", "old html")]:
        (out / name).write_text(text)
    save.write_text("old tuned")
    note = "note: prefetch=nope: invalid: megakernel params: prefetch must be auto, bulk, line or off, got 'nope'"
    run = ["tune", "tiny-llama", "--knob", "prefetch", "--values", "nope", "--contexts", "4", "--steps", "1"]
    r = _cli(*run, "--out", out, "--save", save)
    assert r.exit_code == 2 and r.output.splitlines() == [
        note, f"error: --values: no value of prefetch ran ok (1 value tried, why above); --out {out} and --save "
              f"{save} left as they were"]
    assert {p.name: p.read_text() for p in out.iterdir()} == {"tune.json": "old json", "tune.html": "old html"}
    assert save.read_text() == "old tuned"
    fresh = tmp_path / "fresh"
    r = _cli(*run, "--values", "nope,bad", "--out", fresh)
    assert r.exit_code == 2 and r.output.splitlines()[1:] == [
        "note: prefetch=bad: invalid: megakernel params: prefetch must be auto, bulk, line or off, got 'bad'",
        f"error: --values: no value of prefetch ran ok (2 values tried, why above); --out {fresh} left as it was"]
    assert not fresh.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ts", "ts.json"]


def test_tune_refuses_an_engine_the_device_rules_out_before_the_model_loads(tmp_path, monkeypatch):
    import bubblescope.models.loader as loader

    def no_load(*a, **k):
        raise AssertionError("weights were loaded")
    monkeypatch.setattr(loader, "dummy_weights", no_load)
    r = _cli("tune", "tiny-llama", "--knob", "prefetch", "--values", "off", "--engine", "megakernel-gluon",
             "--device", "cpu", "--out", tmp_path / "o")
    assert r.exit_code == 2 and r.output.splitlines() == [
        "error: --engine megakernel-gluon: the Gluon megakernel needs a CUDA GPU (the CPU interpreter cannot run "
        "Gluon)"]
    assert list(tmp_path.iterdir()) == []


def test_the_cpu_note_is_said_only_when_a_value_ran():
    from rich.console import Console

    from bubblescope.reports.tune_report import ran_on_cpu, render_tune, render_tune_html
    doc = {"engine": "megakernel", "knob": "prefetch", "family": "prefetch", "model": {"name": "m", "dtype": "float32"},
           "device": {"type": "cpu", "name": None, "nvml_peak_GBps": None}, "steps": 1, "contexts": [4],
           "command": "c", "created": "t", "base_params": {}, "best": [],
           "rows": [{"value": None, "text": "nope", "status": "invalid", "reason": "bad", "compile": None,
                     "points": []}]}
    for ok, said in [(False, False), (True, True)]:
        if ok:
            doc["rows"][0]["status"] = "ok"
        console = Console(record=True, width=100)
        render_tune(doc, console)
        assert ran_on_cpu(doc) is said
        assert ("megakernel ran under Triton's interpreter" in console.export_text()) is said
        assert ("megakernel ran under Triton's interpreter" in render_tune_html(doc)) is said


def test_values_given_twice_are_measured_once_with_a_note():
    """`--values 3,3` measured 3 twice: two rows of one value, and noise between them could name either "best".
    Values that parse to the same value (3 and 0x3) repeat too; unparsable texts repeat when they are the same."""
    spec = {k["name"]: k for k in knobs("megakernel")}
    assert unique_values(spec["block_k"], ["3", "5", "3"]) == (["3", "5"], ["--values: 3 given twice: measured once"])
    assert unique_values(spec["block_k"], ["3", "0x3", "x", "x", "x"]) == (["3", "x"], [
        "--values: 3 and 0x3 are one value of block_k: measured once, as 3",
        "--values: x given 3 times: measured once"])
    assert unique_values(spec["block_k"], ["3", "5", "x"]) == (["3", "5", "x"], [])


def test_tune_with_a_value_given_twice_measures_it_once(tmp_path):
    """Through the CLI: one row for `--values 0,0` (an invalid value, so nothing is built), and the note."""
    run = ["tune", "tiny-llama", "--knob", "kv_splits", "--values", "0,0", "--contexts", "4", "--steps", "1"]
    r = _cli(*run, "--out", tmp_path / "t")
    assert r.exit_code == 2 and r.output.splitlines() == [
        "note: --values: 0 given twice: measured once",
        "note: kv_splits=0: invalid: megakernel params: kv_splits must be a positive integer, got 0",
        f"error: --values: no value of kv_splits ran ok (1 value tried, why above); --out {tmp_path / 't'} left as "
        "it was"]


def _noise_doc(second_p50: float) -> dict:
    """Two values at context 128: "256" with per-token samples 1.0, 1.1, 1.2, 1.3 ms (p50 1.15) and "512" at
    ``second_p50``. By hand, the samples' quartiles (linear interpolation) are 1.075 and 1.225: noise 0.15 ms."""
    def row(v, p50, samples):
        return {"value": v, "text": str(v), "status": "ok", "reason": None, "compile": None,
                "points": [{"context": 128, "token_ms_p50": p50, "token_ms_p99": p50, "util_peak": None,
                            "intrakernel_wait_ratio": None, "token_agreement": 1.0, "token_ms_samples": samples}]}
    doc = {"engine": "megakernel", "knob": "block_k", "family": "tile columns", "contexts": [128], "steps": 4,
           "model": {"name": "m", "dtype": "float32"}, "device": {"type": "cpu", "name": "x", "nvml_peak_GBps": None},
           "command": "c", "created": "t", "base_params": {"max_rows": 512, "kv_splits": None},
           "rows": [row(256, 1.15, [1.0, 1.1, 1.2, 1.3]), row(512, second_p50, [second_p50] * 4)]}
    doc["best"] = best_per_context(doc)
    return doc


def test_a_value_is_best_only_when_its_lead_exceeds_the_noise():
    from rich.console import Console

    from bubblescope.reports.tune_report import render_tune, render_tune_html

    close = _noise_doc(1.25)  # lead 0.10 ms, noise 0.15 ms
    (b,) = close["best"]
    assert (b["text"], b["runner_up"], b["within_noise"]) == ("256", "512", True)
    assert b["lead_ms"] == pytest.approx(0.10) and b["noise_ms"] == pytest.approx(0.15)
    console = Console(record=True, width=100)
    render_tune(close, console)
    text = " ".join(console.export_text().split())
    assert "within noise at context 128: block_k=256 (1.150 ms/token p50): 0.100 ms ahead of block_k=512" in text
    assert "no value is best" in text and "best at" not in text
    far = _noise_doc(1.40)  # lead 0.25 ms > 0.15 ms
    assert far["best"][0]["within_noise"] is False
    console = Console(record=True, width=100)
    render_tune(far, console)
    assert "best at context 128: block_k=256 (1.150 ms/token p50): 0.250 ms ahead of block_k=512, more than " \
           "the spread of its own samples (IQR 0.150 ms)" in " ".join(console.export_text().split())
    assert "<td>within noise</td>" in render_tune_html(close) and "<td>best</td>" in render_tune_html(far)
    # samples not recorded (a document written before they were): "lowest p50", never "best"
    for r in far["rows"]:
        del r["points"][0]["token_ms_samples"]
    (b,) = best_per_context(far)
    assert b["within_noise"] is None and b["noise_ms"] is None
    assert "<td>lowest p50</td>" in render_tune_html({**far, "best": [b]})


@pytest.mark.parametrize("name", ["tune.json", "tune.html"])
def test_a_save_path_that_is_one_of_the_outputs_is_refused(tmp_path, name):
    """`tune --out t --save t/tune.json` wrote the tuned file over the tune result (or tune.html) and exited 0."""
    out = tmp_path / "t"
    out.mkdir()
    (out / name).write_text("previous")
    r = _cli("tune", "tiny-llama", "--knob", "kv_splits", "--values", "1", "--contexts", "4", "--steps", "1",
             "--out", out, "--save", out / name)
    assert r.exit_code == 2
    assert r.output.strip() == f"error: --save {out / name}: is where --out {out} writes {name}; name another file"
    assert (out / name).read_text() == "previous" and sorted(p.name for p in out.iterdir()) == [name]
