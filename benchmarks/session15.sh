#!/usr/bin/env bash
# Prepared in session 14 for the fifteenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session15.sh first   # weight_eviction=evict_first on the Gluon kernel (compiled for sm_90 only):
#                                        # the 1B's check with its frames, stories260K and the tiny fp32 models with it;
#                                        # sweep r44 (evict_first alone, with the L2 toucher at 4 and 8, with the
#                                        # per-line prefetch at the dependency wait) on the 1B (128, 4096), Qwen3-0.6B,
#                                        # Qwen2.5-0.5B and the 8B; l2_probe.py v4 (lines read with an L2 evict_last
#                                        # policy against an unhinted stream)
#   bash benchmarks/session15.sh second  # every GPU test (the new forms: evict_first, the toucher, both); the timelines
#                                        # of the 1B and the Qwen presets with norm_load=prefetch (the README's wait
#                                        # ratios of those rows are from earlier kernels)
#   bash benchmarks/session15.sh third   # compute-sanitizer memcheck and racecheck (sanitize_megakernel.py: now with
#                                        # the toucher and evict_first), each tensor its own allocation
#   bash benchmarks/session15.sh qwen    # the Qwen presets' decode-latency set, after a default changes
#   bash benchmarks/session15.sh llama   # the 3B / 8B decode-latency set and their timelines
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gluon_check_params llama-3.2-1b ef '{"weight_eviction": "evict_first"}'
  keep_frames gluon_check_ef
  fp32_check ef '{"weight_eviction": "evict_first"}'
  sweep_set r44
  log l2-probe-v4
  timeout 150 python3 benchmarks/l2_probe.py --cases v4 --out "$R/l2_probe_v4.json" > "$R/l2_probe_v4.log" 2>&1; echo "rc=$?" >> "$R/l2_probe_v4.log"
  cut -c1-200 "$R/l2_probe_v4.log"
  ;;
second)
  gpu_tests
  waits llama-3.2-1b 55
  waits qwen2.5-0.5b 55
  waits qwen3-0.6b 55
  waits qwen3-1.7b 65
  ;;
third)
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # memcheck then sees each tensor's own bounds
  sanitize
  ;;
qwen) issue_sets qwen ;;
llama) llama_presets ;;
*) echo "session15.sh: unknown stage '${1:-}' (first, second, third, qwen, llama)" >&2; exit 2 ;;
esac
finish
