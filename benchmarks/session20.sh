#!/usr/bin/env bash
# The twentieth session's device calls (from the repository root, through the device tool; carry .carry .whl; pass
# BUBBLESCOPE_COMMIT as the full sha from this machine; everything lands under $OUT/run and run.tgz).
#   bash benchmarks/session20.sh first   # sweep r53b (the signal gate at 6 and 8 against 3) on the 1B at 128,
#                                        # Qwen3-0.6B, Qwen2.5-0.5B and the 8B (session 19's r53 saw 6 ahead on the 1B)
#   bash benchmarks/session20.sh second  # sweep r54 (Qwen3's attention: the combine in lanes, the new row after the
#                                        # wait) on Qwen3-0.6B and Qwen3-1.7B; every GPU test (the loader's changes
#                                        # of session 19 have not run on the GPU)
#   bash benchmarks/session20.sh third   # issue 10's decode-latency set on the 1B (and 4096 context) at the commit
#                                        # that closes it; `diagnose model` on the 1B's megakernels (wait ratio, feed);
#                                        # `bubblescope tune` of sig_gate 3 / 6 on the 1B (r53b's one winner, as a user
#                                        # would find it)
#   bash benchmarks/session20.sh fourth  # the merged product at the closing commit: every GPU test; `diagnose model`
#                                        # on the built-in GPU default (every engine, context sweep), then
#                                        # `diagnose trace --html` on its traces
#   bash benchmarks/session20.sh fifth   # every GPU test after the tester's fixes were merged (loader, CLI)
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
third)
  issue_sets 1b
  log "diagnose model llama-3.2-1b"
  timeout 150 python3 -m bubblescope diagnose model llama-3.2-1b --engines megakernel,megakernel-noprefetch \
    --runs 1 --out "$R/diagnose_1b" > "$R/diagnose_1b.log" 2>&1; echo "rc=$?" >> "$R/diagnose_1b.log"
  grep -iE "weight stream|wait|megakernel|rc=" "$R/diagnose_1b.log" | head -14
  log "tune sig_gate llama-3.2-1b"
  timeout 120 python3 -m bubblescope tune llama-3.2-1b --knob sig_gate --values 3,6 --contexts 128,4096 \
    --out "$R/tune_sig_gate_1b" --save "$R/tune_sig_gate_1b.tuned.json" > "$R/tune_sig_gate_1b.log" 2>&1
  echo "rc=$?" >> "$R/tune_sig_gate_1b.log"; tail -14 "$R/tune_sig_gate_1b.log"
  ;;
fourth)
  gpu_tests
  log "diagnose model (the GPU default)"
  timeout 200 python3 -m bubblescope diagnose model --out "$R/diagnose_default" > "$R/diagnose_default.log" 2>&1
  echo "rc=$?" >> "$R/diagnose_default.log"; grep -iE "fastest|: ok|skipped|failed|rc=" "$R/diagnose_default.log" | head -14
  log "diagnose trace --html"
  timeout 60 python3 -m bubblescope diagnose trace "$R/diagnose_default/traces" --html "$R/trace_report.html" \
    > "$R/diagnose_trace.log" 2>&1; echo "rc=$?" >> "$R/diagnose_trace.log"; grep -E "^(PROBLEM|WARN|INFO)|rc=" "$R/diagnose_trace.log"
  rm -rf "$R/diagnose_default/traces"
  ;;
fifth)
  gpu_tests
  ;;
*) echo "session20.sh: unknown stage '${1:-}' (first, ..., fifth)" >&2; exit 2 ;;
esac
finish
