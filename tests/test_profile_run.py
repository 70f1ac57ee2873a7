"""``bubblescope profile`` running real programs on CPU: the window's steps against what the program did, its
output and exit status passed through, what is kept when it fails or ends early, and the bad inputs refused
before it runs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.profile_command import parse_program
from bubblescope.profile_program import OUT_FILES, profile_program
from bubblescope.reports.trace_gate import load_gate_document

ROOT = Path(__file__).resolve().parents[1]

# A greedy decode of a tiny model, one model call per token and no step marker: each step runs the embedding,
# three Linear blocks and the Linear head (4 aten::linear), then argmax. After FAIL_AT tokens it raises.
TINY = textwrap.dedent("""
    import sys
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 32)
            self.blocks = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
            self.head = torch.nn.Linear(32, 64)

        def forward(self, tok):
            return self.head(torch.relu(self.blocks(self.emb(tok))))

    tokens, fail_at = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else -1
    torch.manual_seed(0)
    model = Tiny().eval()
    tok = torch.tensor([1])
    with torch.no_grad():
        for i in range(tokens):
            if i == fail_at:
                raise ValueError(f"stopped at token {i}")
            tok = model(tok).argmax(-1)
    print(f"generated {tokens} tokens")
""")


def _script(tmp_path: Path, name: str = "tiny_decode.py") -> Path:
    path = tmp_path / name
    path.write_text(TINY)
    return path


def _trace_ops(path: Path, name: str) -> int:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == name and e.get("cat") == "cpu_op")


def test_profile_records_the_window_of_a_markerless_decode(tmp_path, capfd):
    script, out = _script(tmp_path), tmp_path / "out"
    outcome = profile_program(parse_program([sys.executable, str(script), "30"]), out, skip=3, steps=8,
                              seconds=None, idle_threshold_us=5.0, analysis={"bytes_per_step": 10**6})
    assert outcome.exit_code == 0 and outcome.error is None
    assert capfd.readouterr().out.strip() == "generated 30 tokens"  # the program's own output
    section = json.loads((out / "profile.json").read_text())["profile"]
    assert section["status"] == "complete" and section["steps_counted"] == 30
    assert section["first_step"] == 4 and section["tokens_generated"] == 8
    # the baseline: skipped steps 0-2 without the first two; the 8 steps timed after the window beside it
    assert section["reference_from"] == "before" and section["reference_steps"] == 1
    assert section["step_ms_p50_after"] is not None
    assert section["calls"] == {"module Tiny": 30}
    assert section["profiler_overhead_pct"] is not None
    # the trace holds the profiler's warm-up step and the 8 window steps: 4 aten::linear each (the script above)
    assert _trace_ops(out / "profile.trace.json.gz", "aten::linear") == 4 * 9
    # found without markers, from the trace alone: the window's step count ± 1
    assert abs(section["steps_found"] - 8) <= 1
    assert sorted(p.name for p in out.iterdir()) == sorted(OUT_FILES)
    # profile.json is the trace result gate reads: its step time and bytes give its GB/s
    doc = load_gate_document(out / "profile.json")
    row = doc["files"][0]
    assert row["steps"] == section["steps_found"] and row["bytes_per_step"] == 10**6
    assert row["effective_GBps"] == pytest.approx(10**6 / (row["step_ms_p50"] * 1e-3) / 1e9, rel=1e-6)
    assert doc["device"]["name"] == "CPU" and row["util_peak"] is None  # no peak for a CPU


def test_a_config_that_cannot_be_read_is_refused_before_the_program_runs(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    ran = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    r = _cli("--model", str(bad), "--", sys.executable, str(script))
    assert r.returncode == 2 and r.stderr.startswith(f"error: --model: ") and r.stderr.count("\n") == 1
    assert not ran.exists()


def test_a_whole_program_profiled_finds_its_step_count_within_one(tmp_path):
    # --skip 0 and a window longer than the program: step 0 is the profiler's warm-up, the 11 others are recorded
    script, out = _script(tmp_path), tmp_path / "out"
    outcome = profile_program(parse_program([sys.executable, str(script), "12"]), out, skip=0, steps=1000,
                              seconds=None, idle_threshold_us=5.0)
    section = outcome.summary["profile"]
    assert outcome.exit_code == 0 and section["status"] == "cut" and section["steps_counted"] == 12
    assert section["tokens_generated"] == 11 and abs(section["steps_found"] - 12) <= 1
    assert _trace_ops(out / "profile.trace.json.gz", "aten::linear") == 4 * 12


def test_a_program_that_fails_inside_the_window_keeps_what_was_recorded(tmp_path, capfd):
    script, out = _script(tmp_path), tmp_path / "out"
    outcome = profile_program(parse_program([sys.executable, str(script), "30", "6"]), out, skip=2, steps=10,
                              seconds=None, idle_threshold_us=5.0)
    err = capfd.readouterr().err
    assert "ValueError: stopped at token 6" in err  # the program's traceback, as Python prints it
    assert outcome.exit_code == 1 and outcome.error is None
    assert outcome.notes[0] == f"{script}: exited with status 1"
    section = outcome.summary["profile"]
    # steps 0-1 skipped, 2 the profiler's warm-up, 3-5 recorded, then token 6 raises
    assert section["status"] == "cut" and section["tokens_generated"] == 3 and section["exit_code"] == 1
    assert _trace_ops(out / "profile.trace.json.gz", "aten::linear") == 4 * 4
    assert json.loads((out / "profile.json").read_text())["profile"]["status"] == "cut"


def test_a_module_that_never_reaches_the_window_leaves_out_as_it_was(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # `python -m` finds the module in the working directory
    _script(tmp_path, "tiny_module.py")
    out = tmp_path / "out"
    out.mkdir()
    (out / "profile.json").write_text("previous run")
    outcome = profile_program(parse_program([sys.executable, "-m", "tiny_module", "2"]), out, skip=5, steps=4,
                              seconds=None, idle_threshold_us=5.0)
    assert capfd.readouterr().out.strip() == "generated 2 tokens"
    assert outcome.exit_code == 2 and outcome.summary is None
    assert outcome.error == ("COMMAND -m tiny_module: ended after 2 steps, before the window (it starts after "
                             "--skip 5); nothing recorded: lower --skip")
    assert [p.name for p in out.iterdir()] == ["profile.json"] and (out / "profile.json").read_text() == \
        "previous run"


def test_a_missing_module_and_an_unwritable_out_are_said_before_the_program_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome = profile_program(parse_program([sys.executable, "-m", "no_such_module_xyz"]), tmp_path / "out",
                              skip=0, steps=1, seconds=None, idle_threshold_us=5.0)
    assert outcome.exit_code == 2 and outcome.error.startswith(
        "COMMAND -m no_such_module_xyz: no module named 'no_such_module_xyz' for ")
    ran = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    (tmp_path / "file").write_text("")
    with pytest.raises(BubblescopeError, match="cannot create the output directory"):
        profile_program(parse_program([sys.executable, str(script)]), tmp_path / "file", skip=0, steps=1,
                        seconds=None, idle_threshold_us=5.0)
    assert not ran.exists()


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "bubblescope", "profile", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--steps", "0", "--", "python", "x.py"], "error: --steps: must be 1 or more, got 0"),
    (["--steps", "2", "--seconds", "1", "--", "python", "x.py"], "error: --steps and --seconds: give one of them"),
    (["--seconds", "nan", "--", "python", "x.py"], "error: --seconds: must be a positive number of seconds"),
    (["--bytes-per-step", "0", "--", "python", "x.py"], "error: --bytes-per-step: must be a whole number of bytes > 0"),
    (["--model", "no-such-model", "--", "python", "x.py"], "error: --model: unknown model 'no-such-model'"),
    (["--peak-gbps", "3350", "--", "python", "x.py"], "error: --peak-gbps: the peak is compared with each step's"),
    (["--skip", "-1", "--", "python", "x.py"], "error: --skip: must be 0 or more, got -1"),
    (["--", "ls", "-l"], "error: COMMAND ls: not a Python program"),
    (["--", "no_such_script.py"], "error: COMMAND no_such_script.py: no such file"),
    ([], "error: COMMAND: missing; give the program after `--`"),
])
def test_cli_refuses_bad_input_in_one_line(args, message):
    r = _cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(message)


@pytest.mark.slow  # transformers' import and a Llama forward per token: about 8 s on the 2-core machine
def test_hf_generate_example_one_step_per_token(tmp_path):
    pytest.importorskip("transformers")
    program = parse_program([sys.executable, str(ROOT / "examples" / "hf_generate.py"), "--tiny", "--prompt-len",
                             "8", "--new-tokens", "16"])
    outcome = profile_program(program, tmp_path / "out", skip=2, steps=5, seconds=None, idle_threshold_us=5.0)
    section = outcome.summary["profile"]
    # generate() calls the model once per new token (the prefill makes the first): 16 outermost calls
    assert section["calls"] == {"module LlamaForCausalLM": 16} and section["tokens_generated"] == 5
    assert abs(section["steps_found"] - 5) <= 1


def test_example_config_is_llama_3_2_1b():
    import ast

    from bubblescope.models.config import get_preset

    tree = ast.parse((ROOT / "examples" / "hf_generate.py").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "LLAMA_3_2_1B")
    example, preset = ast.literal_eval(value), get_preset("llama-3.2-1b").to_hf_dict()
    assert {k: preset[k] for k in example} == example  # diagnose model llama-3.2-1b measures the same model
