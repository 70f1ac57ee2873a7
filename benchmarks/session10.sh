#!/usr/bin/env bash
# The tenth session's device calls (from the repository root, through the device tool; carry .carry .whl; pass
# BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session10.sh first   # every GPU test and Qwen2.5-0.5B's check (argmax, logit error, timeline)
#                                        # on the current defaults: session 9 ended without a GPU run of its last
#                                        # change (Qwen2.5's 64-position attention blocks, 1858cb3)
#   bash benchmarks/session10.sh chain   # the 1B's timeline with its per-task frames kept (the layer's chain task
#                                        # by task); sweep r29 (8 consumer warps) on the 1B, Qwen3-0.6B and the 8B
#   bash benchmarks/session10.sh ahead   # round 30 (mv_ahead=1: the matvec reads slot c + 1 before slot c's
#                                        # products): checked on the 1B, Qwen3-0.6B and Qwen2.5-0.5B (argmax, logit
#                                        # error, timeline with the frames kept), sweep r30 on the 1B (128, 4096),
#                                        # Qwen3-0.6B, Qwen2.5-0.5B and the 8B
#   bash benchmarks/session10.sh boxes   # round 31 (slot_boxes=2: 32 KB ring slots, one release per two boxes;
#                                        # with mv_ahead): checked on the 1B (with its timeline frames), Qwen3-0.6B,
#                                        # Qwen2.5-0.5B (a zero-filled box) and stories / tiny fp32; sweep r31
#   bash benchmarks/session10.sh final   # with mv_ahead=1 the default: every GPU test, issue 10's decode-latency
#                                        # set on the 1B (and 4096)
# Then `session9.sh final` (issue 10's decode-latency set on the 1B and 4096, the Qwen presets, the 1B's timeline)
# and `session9.sh presets` (the larger Llamas, their timelines, every GPU test).
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  gluon_check_params qwen2.5-0.5b bs64 '{}'
  ;;
chain)
  waits llama-3.2-1b 50
  keep_frames timeline
  sweep r29 llama-3.2-1b 128 70
  sweep r29 qwen3-0.6b 128 70
  sweep r29 llama-3.2-1b 4096 70
  sweep r29 llama-3.1-8b 128 110
  ;;
ahead)
  gluon_check_params llama-3.2-1b ahead '{"mv_ahead": 1}'
  keep_frames gluon_check_ahead
  gluon_check_params qwen3-0.6b ahead '{"mv_ahead": 1}'
  gluon_check_params qwen2.5-0.5b ahead '{"mv_ahead": 1}'
  fp32_check ahead '{"mv_ahead": 1}'
  sweep_set r30
  ;;
boxes)
  B='{"slot_boxes": 2, "mv_ahead": 1}'
  gluon_check_params llama-3.2-1b boxes "$B"
  keep_frames gluon_check_boxes
  for m in qwen3-0.6b qwen2.5-0.5b; do
    log "check boxes $m"
    f="$R/gluon_check_boxes_$m"
    timeout 100 python3 benchmarks/gluon_check.py --model $m --out "$f.json" --sections llama --steps 256 --params "$B" > "$f.log" 2>&1; echo "rc=$?" >> "$f.log"
    grep -E "^llama|rc=|Error" "$f.log" | cut -c1-330
  done
  fp32_check boxes "$B"
  sweep_set r31
  ;;
final)
  gpu_tests
  issue_sets 1b
  ;;
*) echo "session10.sh: unknown stage '${1:-}' (first, chain, ahead, boxes, final)" >&2; exit 2 ;;
esac
finish
