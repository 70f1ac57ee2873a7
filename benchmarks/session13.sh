#!/usr/bin/env bash
# The record of session 13's device calls: `one`, `two`, `last` and `norm` ran (results/h200-2026-12-02-s13/README.md);
# `first` and `burst` were folded into them, and `burst` / `one` name gu_burst, removed after r40.
# Prepared in session 12 for the thirteenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session13.sh first   # every GPU test (the tensor-core matvec now also with two boxes per slot),
#                                        # the checks of mv_widen=mma with two boxes per slot on Qwen2.5-0.5B (32
#                                        # rows) and Qwen3-0.6B, then sweeps r39 / r39q
#   bash benchmarks/session13.sh burst   # gu_burst (the producer's L2 burst at a layer's first gate-up tile): the 1B's
#                                        # check with its frames (chain_breakdown.py --model: the stream's feed), r40
#   bash benchmarks/session13.sh qwen    # the Qwen presets' decode-latency set (after an auto rule is made the
#                                        # default on what `first` shows)
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  gluon_check_params qwen2.5-0.5b mmasb2 '{"mv_widen": "mma", "max_rows": 32, "slot_boxes": 2}'
  gluon_check_params qwen3-0.6b mmasb2 '{"mv_widen": "mma", "slot_boxes": 2}'
  sweep r39q qwen2.5-0.5b 128 60
  sweep r39 qwen3-0.6b 128 60
  sweep r39 llama-3.2-1b 128 60
  sweep r39 llama-3.1-8b 128 110
  ;;
burst)  # gu_burst (prepared in session 12): the producer's L2 burst at a layer's first gate-up tile
  gluon_check_params llama-3.2-1b gu16 '{"gu_burst": 16}'
  keep_frames gluon_check_gu16
  sweep r40 llama-3.2-1b 128 60
  sweep r40 qwen2.5-0.5b 128 60
  sweep r40 llama-3.1-8b 128 110
  ;;
one)  # session 13's first call: burst's stages, then r39q on Qwen2.5 and r39 on the 1B (the GPU tests run last,
  # on the session's final kernel)
  gluon_check_params llama-3.2-1b gu16 '{"gu_burst": 16}'
  keep_frames gluon_check_gu16
  sweep r40 llama-3.2-1b 128 60
  sweep r40 qwen2.5-0.5b 128 60
  sweep r40 llama-3.1-8b 128 110
  sweep r39q qwen2.5-0.5b 128 60
  sweep r39 llama-3.2-1b 128 60
  ;;
two)  # inflight (at most N ring slots requested and not landed): the 1B's check with its frames (the stream's feed),
  # sweeps r41 / r41q; the automatic matvec of thin models (Qwen2.5-0.5B: mma, 32 rows, two boxes) is the default now
  gluon_check_params llama-3.2-1b if4 '{"inflight": 4}'
  keep_frames gluon_check_if4
  fp32_check if2 '{"inflight": 2}'
  sweep r41 llama-3.2-1b 128 70
  sweep r41q qwen2.5-0.5b 128 70
  sweep r41 qwen3-0.6b 128 70
  sweep r41 llama-3.1-8b 128 150
  sweep r41 llama-3.2-1b 4096 80
  ;;
last)  # the session's final kernel: every GPU test, the Qwen presets' decode-latency set (Qwen2.5-0.5B now on the
  # tensor-core matvec by default) and Qwen2.5-0.5B's wait ratio
  gpu_tests
  issue_sets qwen
  waits qwen2.5-0.5b 55
  ;;
norm)  # norm_load (the RMSNorm weights beside the vector, or also prefetched into L2 before the wait): the 1B's
  # check with its frames (the stagings), sweep r42 on four presets
  gluon_check_params llama-3.2-1b nlp '{"norm_load": "prefetch"}'
  keep_frames gluon_check_nlp
  sweep r42 llama-3.2-1b 128 60
  sweep r42 qwen3-0.6b 128 60
  sweep r42 qwen2.5-0.5b 128 60
  sweep r42 llama-3.1-8b 128 110
  ;;
qwen) issue_sets qwen ;;
*) echo "session13.sh: unknown stage '${1:-}' (first, burst, one, two, last, norm, qwen)" >&2; exit 2 ;;
esac
finish
