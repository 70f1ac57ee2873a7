#!/usr/bin/env bash
# The twentieth session's device calls (from the repository root, through the device tool; carry .carry .whl; pass
# BUBBLESCOPE_COMMIT as the full sha from this machine; everything lands under $OUT/run and run.tgz).
#   bash benchmarks/session20.sh first   # sweep r53b (the signal gate at 6 and 8 against 3) on the 1B at 128,
#                                        # Qwen3-0.6B, Qwen2.5-0.5B and the 8B (session 19's r53 saw 6 ahead on the 1B)
#   bash benchmarks/session20.sh second  # sweep r54 (Qwen3's attention: the combine in lanes, the new row after the
#                                        # wait) on Qwen3-0.6B and Qwen3-1.7B; every GPU test (the loader's changes
#                                        # of session 19 have not run on the GPU)
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  sweep r53b llama-3.2-1b 128 90
  sweep r53b qwen3-0.6b 128 80
  sweep r53b qwen2.5-0.5b 128 80
  sweep r53b llama-3.1-8b 128 150
  ;;
second)
  sweep r54 qwen3-0.6b 128 90
  sweep r54 qwen3-1.7b 128 100
  gpu_tests
  ;;
*) echo "session20.sh: unknown stage '${1:-}' (first, second)" >&2; exit 2 ;;
esac
finish
