"""Issue 11: listing commands stay light, report never overwrites its input, generate streams its text."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from . import resultsgen as g
from .conftest import ROOT, STORIES, STORIES_TOK, needs_stories


@pytest.mark.parametrize("command", ["presets", "engines"])
def test_listing_commands_do_not_import_torch(command):
    """`presets` and `engines` took 7 s importing torch; they need only the registries."""
    code = ("import sys; sys.argv = ['bubblescope', %r]\nfrom bubblescope.cli import app\ntry:\n    app()\n"
            "except SystemExit:\n    pass\nprint('torch imported' if 'torch' in sys.modules else 'no torch')") % command
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "no torch"
    assert ("llama-3.2-1b" if command == "presets" else "megakernel") in r.stdout


def test_report_refuses_to_overwrite_its_input(tmp_path):
    """`report r.json --html r.json` silently replaced the results with HTML."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    path = tmp_path / "r.json"
    text = json.dumps(g.healthy_doc())
    path.write_text(text)
    (tmp_path / "sub").mkdir()
    for target in (path, tmp_path / "sub" / ".." / "r.json"):
        r = CliRunner().invoke(app, ["report", str(path), "--html", str(target)])
        assert r.exit_code == 2 and r.stderr.startswith(f"error: --html {target}: is the input results file")
        assert path.read_text() == text


class _Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, s):
        self.chunks.append(s)
        return super().write(s)


@needs_stories
def test_generate_streams_text_as_it_is_produced():
    """`generate` printed nothing until the end. The stream writes after each token; what it has written
    after k tokens is the tokenizer's own decode of the prompt and those k tokens (or a prefix of it
    when the last piece is an incomplete character), and the whole equals decode(prompt + tokens)."""
    from bubblescope.engines import build_engine
    from bubblescope.generation import TextStream, generate
    from bubblescope.models import load_llama2c
    from bubblescope.models.tokenizer import Llama2cTokenizer

    weights = load_llama2c(STORIES)
    tok = Llama2cTokenizer(STORIES_TOK)
    ids = tok.encode("Once upon a time", bos=True)
    out = _Writes()
    stream = TextStream(tok, ids, out)
    seen = []

    def on_token(t):
        stream.push(t)
        seen.append((len(out.chunks), out.getvalue()))

    res = generate(build_engine("reference", weights, 64), ids, 24, on_token=on_token)
    stream.close()
    assert out.chunks[0] == tok.decode(ids)
    for k, (n_writes, text) in enumerate(seen, start=1):
        assert tok.decode(ids + res.tokens[:k]).startswith(text)
    assert seen[-1][0] > len(res.tokens) // 2  # written token by token, not once at the end
    assert out.getvalue() == tok.decode(ids + res.tokens) + "\n"


def test_stream_without_tokenizer_writes_ids():
    from bubblescope.generation import TextStream

    out = io.StringIO()
    s = TextStream(None, [1, 5], out)
    assert out.getvalue() == "1 5"
    s.push(7)
    assert out.getvalue() == "1 5 7"
    s.close()
    assert out.getvalue() == "1 5 7\n"
