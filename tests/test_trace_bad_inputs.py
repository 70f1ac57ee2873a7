"""Bad input to ``diagnose trace`` (options, outputs), to ``gate`` on a trace result and to ``profile``'s output
folder: each refused in one line (exit 2, no traceback) or reported as what it is, never as a wrong number, and
the previous run's outputs left whole whatever fails. Every bad input is built here, by hand."""

from __future__ import annotations

import json

import pytest

from . import tracegen as tg


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(r, start):
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {start}"), r.stderr
    assert "Traceback" not in r.output


def _trace(tmp_path, name="t.json", walls=(1000, 1200, 1100)):
    return tg.marked_steps_trace(tmp_path / name, walls=walls)


def _result(tmp_path):
    """A trace result written by ``diagnose trace --json`` (3 steps, 2.4 GB each), as a dict and its path."""
    out = tmp_path / "result.json"
    r = _cli("diagnose", "trace", _trace(tmp_path), "--bytes-per-step", 2_400_000_000, "--json", out)
    assert r.exit_code == 0, r.stderr
    return json.loads(out.read_text()), out


# ---- gate on a hand-edited trace result ----------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["1" + "0" * 400, "-" + "9" * 400])
def test_gate_refuses_an_integer_beyond_float_range_in_one_line(tmp_path, literal):
    doc, out = _result(tmp_path)
    # an integer written out in digits: JSON allows it, float() of it overflows
    out.write_text(json.dumps(doc).replace('"util_peak": ', f'"util_peak": {literal}, "was": ', 1))
    assert json.loads(out.read_text())["files"][0]["util_peak"] == int(literal)
    _one_line_error(_cli("gate", out, "--min-bandwidth-util", 0.1),
                    f"{out}: invalid trace result: files[0].util_peak: {literal[:5]}")
    base = tmp_path / "base.json"
    base.write_text(out.read_text())
    _result(tmp_path)  # a valid result again, gated against the broken baseline
    _one_line_error(_cli("gate", out, "--baseline", base, "--max-regression", 0.1), f"{base}: invalid trace result")


def test_gate_refuses_a_bubble_ratio_above_one(tmp_path):
    doc, out = _result(tmp_path)
    doc["files"][0]["bubble_ratio"] = 5
    out.write_text(json.dumps(doc))
    _one_line_error(_cli("gate", out, "--max-bubble-ratio", 0.5),
                    f"{out}: invalid trace result: files[0].bubble_ratio: 5 is above 1")
    doc["files"][0]["bubble_ratio"] = 1  # the edge: a step with no GPU activity at all
    out.write_text(json.dumps(doc))
    r = _cli("gate", out, "--max-bubble-ratio", 0.5)
    assert r.exit_code == 1 and "gate FAILED" in r.stdout


# ---- outputs that cannot be written --------------------------------------------------------------------------

def test_json_and_html_are_replaced_together_or_not_at_all(tmp_path):
    """Over a 4-kB file size limit the ~1.5-kB --json result fits and the HTML page does not: neither replaces
    the previous run's file (the result used to be replaced before the page failed)."""
    from .test_write_failures import EFBIG, _error_line, _limited, _snapshot

    _trace(tmp_path)
    (tmp_path / "r.json").write_bytes(b"previous result")
    (tmp_path / "r.html").write_bytes(b"<p>previous page</p>")
    before = _snapshot(tmp_path)
    r = _limited(["diagnose", "trace", "t.json", "--bytes-per-step", "2400000000", "--json", "r.json",
                  "--html", "r.html"], 4096, tmp_path)
    assert r.returncode == 2, r.stderr
    assert _error_line(r.stderr) == f"error: --html r.html: cannot write here ({EFBIG})"
    assert "wrote" not in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(tmp_path) == before
    r = _limited(["diagnose", "trace", "t.json", "--bytes-per-step", "2400000000", "--json", "r.json",
                  "--html", "r.html"], 1 << 20, tmp_path)  # room for both: both written
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["bytes_per_step"] == 2_400_000_000
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_profile_whose_trace_the_profiler_could_not_write_leaves_out_as_it_was(tmp_path, monkeypatch):
    """Kineto logs a failed trace write and returns normally, leaving ``<trace>.tmp`` and no trace (as on a full
    disk): profile says so in one line naming the file under --out, exit 2, the previous run's files whole."""
    import sys

    from bubblescope import profile_program as pp

    def failed_export(program, stage, skip, steps, seconds):
        (stage / (pp.RAW_TRACE + ".tmp")).write_bytes(b'{"traceEv')  # what Kineto leaves behind
        state = {"status": "exited", "trace": str(stage / pp.RAW_TRACE), "first_step": 2, "steps_counted": 8,
                 "window_ns": [0, 1000, 2000], "reference_ns": [], "closed_by": "length", "skip": 2, "steps": 2}
        return 0, state

    monkeypatch.setattr(pp, "run_program", failed_export)
    script = tmp_path / "decode.py"
    script.write_text("print('decoding')\n")
    out = tmp_path / "out"
    out.mkdir()
    previous = {name: f"previous {name}".encode() for name in pp.OUT_FILES}
    for name, data in previous.items():
        (out / name).write_bytes(data)
    r = _cli("profile", "--out", out, "--skip", 2, "--steps", 2, "--", sys.executable, script)
    _one_line_error(r, f"--out {out}: cannot write profile.trace.json.gz (the profiler could not write the "
                       "window's trace: the profiler could not write it); the previous run is left as it was")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == previous  # no staging folder, nothing replaced


# ---- --model of a quantized checkpoint ------------------------------------------------------------------------

# A Llama config: hidden 32, MLP 48, 2 layers, 4 heads of 8, 2 KV heads, vocabulary 96, untied.
TINY_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "max_position_embeddings": 64,
               "tie_word_embeddings": False}
# Per layer: q 32×32, k and v 16×32, o 32×32, gate and up 48×32, down 32×48 = 7,680 projection weights in
# 224 output rows; two norms of 32. Outside the layers: one embedding row (32), the final norm (32) and the LM
# head (96×32 = 3,072 weights in 96 rows).
BF16_BYTES = 32 * 2 + 2 * (7680 * 2 + 64 * 2) + 32 * 2 + 3072 * 2                      # 37,248
FP8_BYTES = 32 * 2 + 2 * (7680 + 224 * 4 + 64 * 2) + 32 * 2 + 3072 * 2                  # projections 1 B + 4 B/row
FP8_ALL_BYTES = 32 * 2 + 2 * (7680 + 224 * 4 + 64 * 2) + 32 * 2 + 3072 + 96 * 4        # the LM head too
FP8_DYNAMIC = {  # the quantization_config llm-compressor writes for an FP8-dynamic model
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
    "config_groups": {"group_0": {
        "targets": ["Linear"], "output_activations": None,
        "input_activations": {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True, "type": "float"},
        "weights": {"dynamic": False, "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "float"}}},
}


def _bandwidth(tmp_path, model, *more):
    r = _cli("diagnose", "trace", _trace(tmp_path), "--model", model, "--format", "json", *more)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)["files"][0]["bandwidth"]


@pytest.mark.parametrize("qc, weights, nbytes", [
    (None, "bf16", BF16_BYTES),
    (FP8_DYNAMIC, "fp8", FP8_BYTES),
    ({**FP8_DYNAMIC, "ignore": ["re:.*lm_head"]}, "fp8", FP8_BYTES),
    ({**FP8_DYNAMIC, "ignore": []}, "fp8-all", FP8_ALL_BYTES),
])
def test_an_fp8_checkpoint_config_counts_its_fp8_bytes(tmp_path, qc, weights, nbytes):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**TINY_CONFIG, **({"quantization_config": qc} if qc else {})}))
    for model in (ckpt, ckpt / "config.json"):  # the folder or its config.json
        bw = _bandwidth(tmp_path, model)
        assert bw["weights"] == weights and bw["kv"] == "weights"
        assert [row["bytes"] for row in bw["rows"]] == [nbytes] * 3
        # 1000/1200/1100-µs steps: the median 1,100 µs against the bytes
        assert bw["summary"]["effective_GBps"] == pytest.approx(nbytes / 1100 / 1e3)
    out = tmp_path / "r.json"
    assert _cli("diagnose", "trace", _trace(tmp_path), "--model", ckpt, "--json", out).exit_code == 0
    assert json.loads(out.read_text())["model"]["weights"] == weights


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "quant_method 'awq' is not supported"),
    ({**FP8_DYNAMIC, "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True, "dynamic": False}}}},
     "weights strategy 'tensor'"),
    ("fp8", "quantization_config of type str"),
])
def test_a_quantization_whose_bytes_are_unknown_is_refused(tmp_path, qc, message):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**TINY_CONFIG, "quantization_config": qc}))
    out = tmp_path / "r.json"
    out.write_text("previous run")
    _one_line_error(_cli("diagnose", "trace", _trace(tmp_path), "--model", cfg, "--json", out),
                    f"--model: {cfg}: quantization_config")
    assert message in _cli("diagnose", "trace", _trace(tmp_path), "--model", cfg).stderr
    assert out.read_text() == "previous run"


def test_gate_does_not_compare_fp8_with_bf16_bytes(tmp_path):
    fp8, bf16 = tmp_path / "fp8" / "tiny", tmp_path / "bf16" / "tiny"  # one model name, from the folder
    for folder, qc in ((fp8, FP8_DYNAMIC), (bf16, None)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({**TINY_CONFIG, **({"quantization_config": qc} if qc else {})}))
        r = _cli("diagnose", "trace", _trace(tmp_path), "--model", folder, "--json", folder / "r.json")
        assert r.exit_code == 0, r.stderr
    _one_line_error(_cli("gate", fp8 / "r.json", "--baseline", bf16 / "r.json", "--max-regression", 0.1),
                    "gate: the baseline is not comparable (weights: fp8 vs baseline bf16)")
    old = json.loads((bf16 / "r.json").read_text())
    del old["model"]["weights"]  # a result written before the weight format was recorded: bf16
    (bf16 / "old.json").write_text(json.dumps(old))
    assert _cli("gate", bf16 / "r.json", "--baseline", bf16 / "old.json", "--max-regression", 0.1).exit_code == 0


def test_an_empty_dtype_is_refused_not_taken_as_the_default(tmp_path):
    _one_line_error(_cli("diagnose", "trace", _trace(tmp_path), "--model", "tiny-llama", "--dtype", ""),
                    "--dtype: empty; leave it out for the default (bfloat16)")


# ---- odd deviceProperties ------------------------------------------------------------------------------------

@pytest.mark.parametrize("memory", ["Infinity", "NaN", "1e400", "1" + "0" * 30, "-5", '"lots"', "true"])
def test_a_memory_size_that_is_not_a_byte_count_is_left_out(tmp_path, memory):
    """An H200 by name: the datasheet's 4,800 GB/s holds without the size (its entry needs none); the size is
    unknown (null), never a traceback or a number made of it."""
    path = _trace(tmp_path)
    path.write_text(path.read_text().replace('"totalGlobalMem": 150109880320', f'"totalGlobalMem": {memory}'))
    r = _cli("diagnose", "trace", path, "--bytes-per-step", 2_400_000_000, "--format", "json")
    assert r.exit_code == 0, r.output
    (f,) = json.loads(r.stdout)["files"]
    assert f["device_properties"]["total_memory_bytes"] is None
    assert f["bandwidth"]["peak_GBps"] == 4800.0


@pytest.mark.parametrize("name", ['["NVIDIA H200"]', "5", '""'])
def test_a_gpu_name_that_is_not_a_string_names_no_gpu(tmp_path, name):
    path = _trace(tmp_path)
    path.write_text(path.read_text().replace('"name": "NVIDIA H200"', f'"name": {name}'))
    r = _cli("diagnose", "trace", path, "--bytes-per-step", 2_400_000_000, "--format", "json")
    assert r.exit_code == 0, r.output
    bw = json.loads(r.stdout)["files"][0]["bandwidth"]
    assert bw["peak_GBps"] is None and bw["device"] is None and bw["peak_reason"] == "the trace names no GPU"


# ---- odd distributedInfo -------------------------------------------------------------------------------------

def _rank_trace(tmp_path, rank, world, name=None):
    """A rank's trace of two ProfilerStep ranges, one kernel each; ``rank`` and ``world`` as written in JSON."""
    ev = []
    for n in (1, 2):
        ev += [tg.annotation(f"ProfilerStep#{n}", 100 * n, 100), tg.launch(100 * n + 5, 1, n),
               tg.kernel("gemv", 100 * n + 10, 30, n)]
    text = json.dumps(tg.document(tg.meta_events() + ev, rank=None,
                                  distributedInfo={"backend": "nccl", "rank": "RANK", "world_size": "WORLD"}))
    path = tmp_path / (name or f"r{rank}.json")
    path.write_text(text.replace('"RANK"', str(rank)).replace('"WORLD"', str(world)))
    return path


def test_a_huge_world_size_counts_the_missing_ranks_without_listing_them(tmp_path):
    from bubblescope.profiler.trace.ranksummary import MAX_LISTED_MISSING

    world = MAX_LISTED_MISSING + 3  # ranks 0 and 1 given: one more missing than are listed
    r = _cli("diagnose", "trace", _rank_trace(tmp_path, 0, world), _rank_trace(tmp_path, 1, world), "--format", "json")
    assert r.exit_code == 0, r.output
    ranks = json.loads(r.stdout)["ranks"]
    assert ranks["missing_ranks"] == []
    assert f"ranks 0, 1 of world size {world} given: {world - 2:,} ranks missing" in ranks["warnings"][0]


@pytest.mark.parametrize("rank, world", [("1" + "0" * 400, 2), (-1, 2), (0, "1" + "0" * 400), (0, -2)])
def test_a_rank_or_world_size_that_is_not_a_rank_is_not_read(tmp_path, rank, world):
    """An integer beyond float range (a traceback before) or a negative one is not a rank (the file has none),
    and no rank is said to be missing of a world size that is not one."""
    a, b = _rank_trace(tmp_path, rank, world, "a.json"), _rank_trace(tmp_path, 1, 2, "b.json")
    r = _cli("diagnose", "trace", a, b, "--ranks", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [f["rank"] for f in doc["files"]] == [0 if rank == 0 else None, 1]
    assert doc["ranks"]["missing_ranks"] is None


def test_a_context_beyond_the_model_is_refused_before_the_program_runs(tmp_path):
    """tiny-llama holds 65,536 positions: --context 100000 used to be found only after the program had run, and
    the trace was then published alone, the previous profile.json and profile.html removed."""
    import sys

    ran = tmp_path / "ran"
    script = tmp_path / "decode.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "profile.json").write_bytes(b"previous")
    r = _cli("profile", "--out", out, "--model", "tiny-llama", "--context", 100_000, "--", sys.executable, script)
    _one_line_error(r, "--context 100000: beyond tiny-llama's max_position_embeddings 65536")
    assert not ran.exists() and [p.name for p in out.iterdir()] == ["profile.json"]
    _one_line_error(_cli("diagnose", "trace", _trace(tmp_path), "--model", "tiny-llama", "--context", 65537),
                    "--context 65537: beyond tiny-llama's max_position_embeddings 65536")
    r = _cli("diagnose", "trace", _trace(tmp_path), "--model", "tiny-llama", "--context", 65536, "--format", "json")
    assert r.exit_code == 2 and "context 65537 exceeds" in r.stderr  # the second step reads one position more
    r = _cli("diagnose", "trace", _trace(tmp_path), "--model", "tiny-llama", "--context", 65534, "--format", "json")
    assert r.exit_code == 0 and [row["context"] for row in json.loads(r.stdout)["files"][0]["bandwidth"]["rows"]] \
        == [65534, 65535, 65536]


@pytest.mark.parametrize("target", ["config.json", "generation_config.json"])
@pytest.mark.parametrize("option", ["--json", "--html"])
def test_an_output_that_is_the_model_config_is_refused(tmp_path, option, target):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = json.dumps(TINY_CONFIG)
    (ckpt / "config.json").write_text(config)
    (ckpt / "generation_config.json").write_text('{"eos_token_id": 2}')
    before = {p.name: p.read_text() for p in ckpt.iterdir()}
    for model in (ckpt, ckpt / "config.json"):
        _one_line_error(_cli("diagnose", "trace", _trace(tmp_path), "--model", model, option, ckpt / target),
                        f"{option} {ckpt / target}: is the --model config ({ckpt / target}); choose another path")
    assert {p.name: p.read_text() for p in ckpt.iterdir()} == before
    assert _cli("diagnose", "trace", _trace(tmp_path), "--model", ckpt, option, tmp_path / "out").exit_code == 0
