"""``bubblescope profile`` on a GPU: a loop replaying a CUDA graph per token, and Hugging Face ``generate``; the
steps the trace analysis finds without markers against the steps the hooks counted."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bubblescope.profile_command import parse_program
from bubblescope.profile_program import profile_program

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]

# A tiny decode step captured once in a CUDA graph, then replayed once per token, each token taken to the host.
GRAPH_LOOP = textwrap.dedent("""
    import sys
    import torch

    n = int(sys.argv[1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 64), *[torch.nn.Linear(64, 64) for _ in range(4)],
                                torch.nn.Linear(64, 256)).cuda().eval()
    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as the CUDA-graph docs say
            for _ in range(2):
                out = model(tok).argmax(-1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(tok).argmax(-1)
        for _ in range(n):
            graph.replay()
            tok.copy_(out)
            int(tok)
    print(f"generated {n} tokens")
""")


def test_graph_replay_loop_steps_found_from_the_graph_launches(tmp_path):
    script = tmp_path / "graph_loop.py"
    script.write_text(GRAPH_LOOP)
    outcome = profile_program(parse_program([sys.executable, str(script), "60"]), tmp_path / "out", skip=5,
                              steps=20, seconds=None, idle_threshold_us=5.0, analysis={"bytes_per_step": 10**6})
    assert outcome.exit_code == 0, outcome.error
    doc = json.loads((tmp_path / "out" / "profile.json").read_text())
    section, row = doc["profile"], doc["files"][0]
    assert section["calls"]["CUDAGraph.replay"] == 60 and section["graph_replays"] == 60
    assert section["tokens_generated"] == 20
    assert abs(section["steps_found"] - 20) <= 1 and row["steps_found_by"] == "cuda-graph"
    assert row["effective_GBps"] == pytest.approx(10**6 / (row["step_ms_p50"] * 1e-3) / 1e9, rel=1e-6)
    assert doc["device"]["name"] not in (None, "CPU")


def test_hf_generate_steps_found_within_one_of_the_tokens_in_the_window(tmp_path):
    pytest.importorskip("transformers")
    program = parse_program([sys.executable, str(ROOT / "examples" / "hf_generate.py"), "--tiny", "--prompt-len",
                             "16", "--new-tokens", "64"])
    outcome = profile_program(program, tmp_path / "out", skip=5, steps=20, seconds=None, idle_threshold_us=5.0)
    assert outcome.exit_code == 0, outcome.error
    section = outcome.summary["profile"]
    assert section["calls"] == {"module LlamaForCausalLM": 64} and section["tokens_generated"] == 20
    assert abs(section["steps_found"] - 20) <= 1
    assert section["profiler_overhead_pct"] is not None
