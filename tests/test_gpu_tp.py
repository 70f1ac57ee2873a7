"""Two-GPU checks of the tensor-parallel reference engine over NCCL (skipped without two CUDA devices).

Eager and CUDA-graph TP=2 on a small float32 config must give TP=1's greedy tokens, and the graph replay (the
step's all-reduces and the logits all-gather captured inside it) must give the eager TP=2 logits (within 1e-5).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0) as the device notes ask.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bubblescope.generation import generate
from bubblescope.models import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .tp_gpu_worker import CFG, PROMPT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def test_tp2_nccl_eager_and_cudagraph_match_tp1(tmp_path):
    # The ranks run under torchrun in a subprocess with a deadline, as `diagnose model --tp` runs them: a hung
    # collective is a failure with each rank's stack (faulthandler), never a hung test run. (torch.multiprocessing.spawn
    # inside pytest hung on an H200 pair.)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), str(Path(__file__).resolve().parents[1]),
         os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(Path(__file__).with_name("tp_gpu_worker.py")), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    w = dummy_weights(CFG, "cuda:0", torch.float32, seed=3)
    want = generate(ReferenceEngine(w, "eager", 128), PROMPT, 64, eos_ids=()).tokens
    assert got[0]["eager"] == want and got[1]["eager"] == want
    assert got[0]["cudagraph"] == want
    assert (got[0]["cudagraph_logits"] - got[0]["eager_logits"]).abs().max().item() < 1e-5
