"""How fast can every SM add float32 partials into a few shared vectors? (sixteenth session, after r48 / r49).

``fuse_down`` (removed) had each gate-up task add H = 2048 float32 partials into its layer's accumulator with relaxed
atomics; the 1B's gate-up tasks then took ~8.6 µs more each, with one accumulator or with 8 copies of it. This probe
separates the atomics from the rest of that path: 132 programs (one per H200 SM), each adding ``REPS`` vectors of
``H`` float32 with ``tl.atomic_add`` (relaxed, gpu scope) into (a) one shared vector, (b) ``copies`` vectors
(program p into copy p mod copies), (c) its own vector, and (d) plain stores into its own vector for contrast.
Prints, per case, the kernel's time (µs: the median over 5 samples of 20 back-to-back launches between two CUDA
events, divided by 20, so the host's launch time overlaps the previous kernel) and the ns per float per SM. The
session-16 record (b75569f) timed one launch per event pair, the launch time inside it: its numbers are upper bounds.

Usage (on a GPU): python benchmarks/atomic_probe.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _adds(dst_ptr, H: tl.constexpr, REPS: tl.constexpr, COPIES: tl.constexpr, STORE: tl.constexpr,
          BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = dst_ptr + (pid % COPIES) * H
    k = tl.arange(0, BLOCK)
    for r in range(REPS):
        for c in tl.static_range(0, H, BLOCK):
            v = (k + r).to(tl.float32) * 1e-3
            if STORE:
                tl.store(base + c + k, v)
            else:
                tl.atomic_add(base + c + k, v, sem="relaxed", scope="gpu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    H, REPS = 2048, 16
    out = {"device": torch.cuda.get_device_name(0), "sms": sms, "H": H, "reps": REPS, "cases": {}}
    for name, copies, store in (("one-vector", 1, False), ("8-copies", 8, False), ("own-vector", sms, False),
                                ("own-vector-store", sms, True)):
        dst = torch.zeros(copies * H, dtype=torch.float32, device="cuda")
        f = lambda: _adds[(sms,)](dst, H=H, REPS=REPS, COPIES=copies, STORE=store, BLOCK=512, num_warps=4)  # noqa: E731
        f()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                f()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / 20)  # µs per launch
        us = statistics.median(times)
        out["cases"][name] = {"us": round(us, 2), "ns_per_float_per_sm": round(us * 1e3 / (REPS * H), 3)}
        print(name, out["cases"][name], flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
