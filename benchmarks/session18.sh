#!/usr/bin/env bash
# The eighteenth session's device calls (from the repository root, through the device tool; carry .carry .whl; pass
# BUBBLESCOPE_COMMIT as the full sha from this machine, not $(git rev-parse HEAD) on the device, whose checkout's HEAD
# is not the working tree; everything lands under $OUT/run and run.tgz). The first call ran session17.sh first
# (every GPU test, then compute-sanitizer memcheck and racecheck).
#   bash benchmarks/session18.sh second  # racecheck on benchmarks/racecheck_ws_probe.py (is racecheck's report on
#                                        # the megakernel Triton's partition set-up?); sweep r50 (the attention gate
#                                        # at 4096 and 128); benchmarks/atomic_probe.py (20 launches per sample);
#                                        # one step's timeline of Qwen2.5-0.5B and Qwen3-0.6B
#   bash benchmarks/session18.sh third   # sweep r50 on Qwen2.5-0.5B, the 3B and the 8B (the gate at 0 gained 1-2 % on
#                                        # the 1B at 128, ~0.5 % at 4096, in second); one step's timeline of Qwen3-1.7B, the
#                                        # 3B and the 8B (the README's wait ratios are from before the in-flight cap)
#   bash benchmarks/session18.sh fourth  # with attn_gate 0 the default on every model (r50): every GPU test, the
#                                        # 1B's decode-latency set, the 8B's against compile
#   bash benchmarks/session18.sh fifth   # the same default: the Qwen presets' decode-latency sets and the 3B's
#   bash benchmarks/session18.sh sixth   # the same default: `diagnose model` on the 1B's megakernels (wait ratio, feed)
#                                        # and the 1B's one-step timeline
#   bash benchmarks/session18.sh seventh # the 1B's one-step timeline with its frames at context 4096 and 128 (where
#                                        # the long-context step's attention time goes)
. benchmarks/device_prelude.sh
case "${1:-}" in
second)
  log "racecheck probe"
  timeout 90 compute-sanitizer --tool racecheck --print-limit 20 python3 benchmarks/racecheck_ws_probe.py > "$R/racecheck_ws_probe.log" 2>&1; echo "rc=$?" >> "$R/racecheck_ws_probe.log"
  tail -12 "$R/racecheck_ws_probe.log"
  sweep r50 llama-3.2-1b 4096 90
  sweep r50 llama-3.2-1b 128 75
  log "atomic probe"
  timeout 60 python3 benchmarks/atomic_probe.py --out "$R/atomic_probe.json" > "$R/atomic_probe.log" 2>&1; echo "rc=$?" >> "$R/atomic_probe.log"
  tail -8 "$R/atomic_probe.log"
  waits qwen2.5-0.5b 50
  waits qwen3-0.6b 50
  ;;
third)
  sweep r50 qwen2.5-0.5b 128 60
  sweep r50 llama-3.2-3b 128 80
  sweep r50 llama-3.1-8b 128 110
  waits qwen3-1.7b 60
  waits llama-3.2-3b 60
  waits llama-3.1-8b 70
  ;;
fourth)
  gpu_tests
  issue_sets 1b
  latency 8b 150 --models llama-3.1-8b --engines reference-compile,megakernel --runs 2 --long-contexts ""
  ;;
fifth)
  issue_sets qwen
  latency 3b 120 --models llama-3.2-3b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts ""
  ;;
sixth)
  log "diagnose model llama-3.2-1b"
  timeout 150 python3 -m bubblescope diagnose model llama-3.2-1b --engines megakernel,megakernel-noprefetch \
    --runs 1 --out "$R/diagnose_1b" > "$R/diagnose_1b.log" 2>&1; echo "rc=$?" >> "$R/diagnose_1b.log"
  grep -iE "weight stream|megakernel|rc=" "$R/diagnose_1b.log" | head -12
  waits llama-3.2-1b 55
  ;;
seventh)
  for ctx in 4096 128; do
    log "timeline llama-3.2-1b $ctx"
    timeout 70 python3 benchmarks/gluon_check.py --model llama-3.2-1b --context $ctx --out "$R/long_$ctx.json" \
      --sections timeline > "$R/long_$ctx.log" 2>&1; echo "rc=$?" >> "$R/long_$ctx.log"
    tail -3 "$R/long_$ctx.log" | cut -c1-300
  done
  keep_frames long
  ;;
*) echo "session18.sh: unknown stage '${1:-}' (second, ..., seventh)" >&2; exit 2 ;;
esac
finish
