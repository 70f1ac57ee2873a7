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
    """Marked steps of one 400-µs kernel each, of the given wall times (µs), on an H200 (datasheet 4,800 GB/s)."""
    ev, t = tg.meta_events(), 0.0
    for i, wall in enumerate(walls):
        ev += [tg.annotation(f"bubblescope.decode_step#{i}", t, wall), tg.launch(t + 1, 2, i + 1),
               tg.kernel("gemv", t + 10, 400, i + 1)]
        t += wall
    doc = tg.document(ev, rank=None)
    doc["deviceProperties"][0].update(name="NVIDIA H200", totalGlobalMem=150_109_880_320)
    return tg.write(tmp_path / name, doc)


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
