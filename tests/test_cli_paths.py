"""Path names the OS refuses (a component over 255 bytes, a file where a folder should be, a symlink loop) are
bad input: one ``error: <path>: <strerror>`` line and exit 2, in every command, never a traceback."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from . import resultsgen as g
from .conftest import ROOT

LONG = "n" * 300  # one component of 300 bytes: beyond NAME_MAX (255) of Linux and macOS file systems
TUNE = ["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--device", "cpu", "--steps", "1",
        "--contexts", "8"]
GEN = ["--device", "cpu", "--prompt-ids", "1", "--max-new-tokens", "1"]


@pytest.mark.parametrize("args", [
    ["diagnose", "model", "tiny-llama", "--device", "cpu", "--out", LONG],
    ["diagnose", "model", "tiny-llama", "--device", "cpu", "--out", "o", "--tuning", LONG],
    ["diagnose", "model", "tiny-llama", "--device", "cpu", "--out", "o", "--checkpoint", LONG],
    ["diagnose", "model", "tiny-llama", "--device", "cpu", "--tp", "2", "--out", LONG],
    ["report", LONG],
    ["report", "r.json", "--html", LONG],
    ["gate", LONG, "--max-bubble-ratio", "0.5"],
    ["gate", "r.json", "--baseline", LONG, "--max-regression", "0.1"],
    ["diagnose", "trace", LONG],
    ["generate", LONG, *GEN],
    ["generate", "tiny-llama", *GEN, "--tuning", LONG],
    ["generate", "tiny-llama", *GEN, "--checkpoint", LONG],
    ["generate", "tiny-llama", *GEN, "--tokenizer", LONG],
    [*TUNE, "--out", LONG],
    [*TUNE, "--out", "t", "--save", LONG],
], ids=lambda a: " ".join(x if x != LONG else "LONG" for x in a if x not in (GEN + TUNE[2:]) or x == LONG))
def test_a_name_too_long_is_one_line_and_exit_2(tmp_path, monkeypatch, args):
    """Each of these raised OSError [Errno 36] with a traceback and exit 1."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(g.healthy_doc()))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = CliRunner().invoke(app, args)
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"error: {LONG}: File name too long\n"), r.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_name_too_long_through_the_installed_entry_point(tmp_path):
    """The same through ``python -m bubblescope.cli`` (main(), not CliRunner): no traceback on stderr."""
    for args in (["report", LONG], ["diagnose", "trace", "ok", LONG]):
        r = subprocess.run([sys.executable, "-m", "bubblescope.cli", *args], capture_output=True, text=True,
                           cwd=tmp_path, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {LONG}: File name too long\n")


def test_only_an_oserror_about_a_named_path_is_taken_for_bad_input():
    """An OSError without a filename, or of another kind (a full disk, a broken pipe), stays a bug with its
    traceback: user_errors re-raises it."""
    import typer

    from bubblescope.cli import user_errors
    from bubblescope.errors import path_error

    assert path_error(OSError(errno.ENAMETOOLONG, "File name too long", "x" * 300)) == \
        "x" * 300 + ": File name too long"
    assert path_error(OSError(errno.EACCES, "Permission denied", "a\nb")) == "'a\\nb': Permission denied"
    assert path_error(OSError(errno.ENAMETOOLONG, "File name too long")) is None
    assert path_error(OSError(errno.ENOSPC, "No space left on device", "f")) is None
    assert path_error(ValueError("f")) is None

    for exc in (OSError(errno.ENOSPC, "No space left on device", "f"), OSError(errno.EACCES, "Permission denied")):
        @user_errors
        def boom(exc=exc):
            raise exc
        with pytest.raises(OSError):
            boom()

    @user_errors
    def named():
        raise PermissionError(errno.EACCES, "Permission denied", "/root/x")
    with pytest.raises(typer.Exit) as e:
        named()
    assert e.value.exit_code == 2
