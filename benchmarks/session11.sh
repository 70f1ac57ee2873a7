#!/usr/bin/env bash
# Prepared in session 10 for the eleventh session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session11.sh first   # round 32 (compiled for sm_90 but never run): every GPU test, then
#                                        # attn_new_row=row + attn_combine=lanes and attn_reduce=oproj checked on the
#                                        # 1B (timeline frames kept: chain_breakdown.py), Qwen3-0.6B and Qwen2.5-0.5B
#   bash benchmarks/session11.sh r32     # the sweep of the three switches
#   bash benchmarks/session11.sh sanitize # compute-sanitizer memcheck / racecheck, now with attn_reduce=oproj (fused
#                                        # and stages) and attn_combine=lanes + attn_new_row=row on tiny Llama
# attn_reduce=oproj lost in r32 and was removed in session 11 (after `first` and `r32` ran): their oproj parts
# no longer build.
# Then `session9.sh presets` and `issue_sets qwen`: the larger Llamas and the Qwen presets were last recorded in
# session 8, before mv_ahead=1 became the default.
. benchmarks/device_prelude.sh
case "${1:-}" in
first)  # every GPU test (the default kernel changed after the last GPU run), then round 32's checks
  gpu_tests
  for tag in rowlanes oproj; do
    case $tag in rowlanes) P='{"attn_new_row": "row", "attn_combine": "lanes"}' ;; oproj) P='{"attn_reduce": "oproj"}' ;; esac
    gluon_check_params llama-3.2-1b $tag "$P"
    keep_frames gluon_check_$tag
    gluon_check_params qwen3-0.6b $tag "$P"
    gluon_check_params qwen2.5-0.5b $tag "$P"
  done
  ;;
r32) sweep_set r32 ;;
defaults)  # with row + lanes the default: every GPU test, issue 10's 1B set, the Qwen presets' set
  gpu_tests
  issue_sets 1b
  issue_sets qwen
  ;;
llama) issue_sets llama; sanitize ;;
r33)  # the split length and the signal gate with row + lanes the default; row + lanes at 4096
  sweep r33 llama-3.2-1b 128 70
  sweep r33 qwen2.5-0.5b 128 60
  sweep r33 qwen3-0.6b 128 60
  sweep r32long llama-3.2-1b 4096 70
  ;;
sanitize) sanitize ;;
*) echo "session11.sh: unknown stage '${1:-}' (first, r32, defaults, llama, r33, sanitize)" >&2; exit 2 ;;
esac
finish
