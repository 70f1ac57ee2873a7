#!/usr/bin/env bash
# Prepared in session 13 for the fourteenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session14.sh first   # every GPU test; r42 (norm_load beside / prefetch) again on the 1B, Qwen2.5-0.5B
#                                        # and Qwen3-0.6B (session 13's machine could not resolve half a microsecond per
#                                        # layer); r39 (two boxes per slot) on the 3B and the 8B, for a rule beside
#                                        # Qwen3-1.7B's 3-4 % (two sweeps) and the 1B's / Qwen3-0.6B's losses
#   bash benchmarks/session14.sh probe   # (as run first) the L2 probe (benchmarks/l2_probe.py: does a prefetch stall its
#                                        # warp, and do its lines survive the stream?), then first's sweeps, no GPU tests
#   bash benchmarks/session14.sh second  # the L2 probe's v2 cases (demand loads as the "prefetch"; 32-64 KB prefetches
#                                        # under a stream), every GPU test with norm_load=prefetch the default, the 1B's
#                                        # decode-latency set
#   bash benchmarks/session14.sh third   # the L2 probe's v3 cases (A read .cg, so the re-read is an L2 hit or an HBM
#                                        # read, never L1's), the Qwen presets' decode-latency set with the new default
#   bash benchmarks/session14.sh touch   # the L2 toucher (l2_touch, new): sweep r43 on the 1B, its check with frames,
#                                        # stories260K and the tiny fp32 models with it, r43 on Qwen2.5-0.5B and the 8B
#                                        # (ran at df52673; l2_touch was removed after it, so this stage no longer runs)
#   bash benchmarks/session14.sh qwen    # the Qwen presets' decode-latency set, after a default changes
#   bash benchmarks/session14.sh llama   # the 3B / 8B decode-latency set and their timelines
. benchmarks/device_prelude.sh
case "${1:-}" in
probe|first)
  if [ "$1" = probe ]; then
    log l2-probe
    timeout 200 python3 benchmarks/l2_probe.py --out "$R/l2_probe.json" > "$R/l2_probe.log" 2>&1; echo "rc=$?" >> "$R/l2_probe.log"
    cut -c1-230 "$R/l2_probe.log"
  else
    gpu_tests
  fi
  sweep r42 llama-3.2-1b 128 60
  sweep r42 qwen2.5-0.5b 128 60
  sweep r42 qwen3-0.6b 128 60
  sweep r39 llama-3.2-3b 128 80
  sweep r39 llama-3.1-8b 128 110
  ;;
second)
  log l2-probe-v2
  timeout 200 python3 benchmarks/l2_probe.py --cases v2 --out "$R/l2_probe_v2.json" > "$R/l2_probe_v2.log" 2>&1; echo "rc=$?" >> "$R/l2_probe_v2.log"
  cut -c1-200 "$R/l2_probe_v2.log"
  gpu_tests
  issue_sets 1b
  ;;
third)
  log l2-probe-v3
  timeout 150 python3 benchmarks/l2_probe.py --cases v3 --out "$R/l2_probe_v3.json" > "$R/l2_probe_v3.log" 2>&1; echo "rc=$?" >> "$R/l2_probe_v3.log"
  cut -c1-200 "$R/l2_probe_v3.log"
  issue_sets qwen
  ;;
touch)
  sweep r43 llama-3.2-1b 128 80
  gluon_check_params llama-3.2-1b lt8 '{"l2_touch": 8}'
  keep_frames gluon_check_lt8
  fp32_check lt4 '{"l2_touch": 4}'
  sweep r43 qwen2.5-0.5b 128 80
  sweep r43 llama-3.1-8b 128 130
  ;;
qwen) issue_sets qwen ;;
llama) llama_presets ;;
*) echo "session14.sh: unknown stage '${1:-}' (probe, first, second, third, touch, qwen, llama)" >&2; exit 2 ;;
esac
finish
