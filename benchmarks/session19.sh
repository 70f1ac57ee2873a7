#!/usr/bin/env bash
# The nineteenth session's device calls (from the repository root, through the device tool; carry .carry .whl; pass
# BUBBLESCOPE_COMMIT as the full sha from this machine, not $(git rev-parse HEAD) on the device, whose checkout's HEAD
# is not the working tree; everything lands under $OUT/run and run.tgz).
#   bash benchmarks/session19.sh first   # sweep r51 (the attention gate at 4 / 8 tiles and off, against 0) and r52
#                                        # (128-position attention blocks; splits of at least 64 positions) on the
#                                        # 1B at 128 and 4096
#   bash benchmarks/session19.sh second  # every GPU test (the loader now refuses checkpoint tensors a model does not
#                                        # use: every preset must still load); one step's timeline with its per-task
#                                        # frames of the presets other than the 1B on today's kernel (their wait ratios
#                                        # in the README predate the attention gate at 0; benchmarks/edge_bounds.py reads
#                                        # the frames)
#   bash benchmarks/session19.sh third   # sweep r53 (the signal gate at 6 / 12 tiles and off, against 3, now that the
#                                        # in-flight cap bounds the loads a signal's release waits for) on the 1B at
#                                        # 128 and 4096 and the 8B
#   bash benchmarks/session19.sh fourth  # (run instead of second and third when no machine was lent for a while)
#                                        # r53 on the 1B at 128; second's timelines with frames, without the GPU tests
#   bash benchmarks/session19.sh fifth   # r53b (the signal gate at 6 and 8 against 3) on the 1B at 128 and 4096, the 8B
#                                        # and Qwen3-0.6B
#   bash benchmarks/session19.sh sixth   # (commit 6c683b8, sig_gate 6 the default then; reverted) r53b on the 1B at 128, Qwen3-0.6B and the
#                                        # 8B; the 1B's decode-latency set
#   bash benchmarks/session19.sh seventh # sixth without the decode-latency set (the device time left)
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  sweep r51 llama-3.2-1b 128 100
  sweep r51 llama-3.2-1b 4096 110
  sweep r52 llama-3.2-1b 128 80
  sweep r52 llama-3.2-1b 4096 90
  ;;
second)
  gpu_tests
  for m in qwen2.5-0.5b qwen3-0.6b qwen3-1.7b llama-3.2-3b llama-3.1-8b; do waits $m 75; done
  keep_frames timeline
  ;;
third)
  sweep r53 llama-3.2-1b 128 100
  sweep r53 llama-3.2-1b 4096 110
  sweep r53 llama-3.1-8b 128 160
  ;;
fourth)
  sweep r53 llama-3.2-1b 128 100
  for m in qwen2.5-0.5b qwen3-0.6b qwen3-1.7b llama-3.2-3b llama-3.1-8b; do waits $m 75; done
  keep_frames timeline
  ;;
fifth)
  sweep r53b llama-3.2-1b 128 90
  sweep r53b qwen3-0.6b 128 80
  sweep r53b llama-3.2-1b 4096 100
  sweep r53b llama-3.1-8b 128 150
  ;;
sixth)
  sweep r53b llama-3.2-1b 128 90
  sweep r53b qwen3-0.6b 128 80
  sweep r53b llama-3.1-8b 128 150
  issue_sets 1b
  ;;
seventh)
  sweep r53b llama-3.2-1b 128 90
  sweep r53b qwen3-0.6b 128 80
  sweep r53b llama-3.1-8b 128 150
  ;;
*) echo "session19.sh: unknown stage '${1:-}' (first, ..., seventh)" >&2; exit 2 ;;
esac
finish
