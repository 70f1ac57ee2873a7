#!/usr/bin/env bash
# Prepared in session 9 for the tenth session's first device call (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session10.sh first   # every GPU test and Qwen2.5-0.5B's check (argmax, logit error, timeline)
#                                        # on the current defaults: session 9 ended without a GPU run of its last
#                                        # change (Qwen2.5's 64-position attention blocks, 1858cb3)
# Then `session9.sh final` (issue 10's decode-latency set on the 1B and 4096, the Qwen presets, the 1B's timeline)
# and `session9.sh presets` (the larger Llamas, their timelines, every GPU test).
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  gluon_check_params qwen2.5-0.5b bs64 '{}'
  ;;
*) echo "session10.sh: unknown stage '${1:-}' (first)" >&2; exit 2 ;;
esac
finish
