#!/usr/bin/env bash
# Prepared in session 9 for the tenth session's device calls (from the repository root, through the device tool;
# carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session10.sh first   # every GPU test and Qwen2.5-0.5B's check (argmax, logit error, timeline)
#                                        # on the current defaults: session 9 ended without a GPU run of its last
#                                        # change (Qwen2.5's 64-position attention blocks, 1858cb3)
#   bash benchmarks/session10.sh final   # issue 10's decode-latency set on the 1B (and 4096), the Qwen presets
#   bash benchmarks/session10.sh presets # Llama-3.2-3B and 3.1-8B (2 runs), their timelines
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  gluon_check_params qwen2.5-0.5b bs64 '{}'
  ;;
final)
  issue_sets 1b
  issue_sets qwen
  waits llama-3.2-1b 50
  ;;
presets)
  issue_sets llama
  waits llama-3.2-3b 55
  waits llama-3.1-8b 65
  ;;
*) echo "session10.sh: unknown stage '${1:-}' (first, final, presets)" >&2; exit 2 ;;
esac
finish
