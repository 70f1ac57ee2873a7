#!/usr/bin/env bash
# Prepared in session 14 for the fifteenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session15.sh first   # (ran at 7c5fdff; its r44 rows with the toucher now raise, removed after it)
#                                        # weight_eviction=evict_first on the Gluon kernel:
#                                        # the 1B's check with its frames, stories260K and the tiny fp32 models with it;
#                                        # sweep r44 (evict_first alone, with the L2 toucher at 4 and 8, with the
#                                        # per-line prefetch at the dependency wait) on the 1B (128, 4096), Qwen3-0.6B,
#                                        # Qwen2.5-0.5B and the 8B; l2_probe.py v4 (lines read with an L2 evict_last
#                                        # policy against an unhinted stream)
#   bash benchmarks/session15.sh second  # (after r44: evict_first the default, the toucher removed) every GPU test,
#                                        # the 1B's decode-latency set and its timeline
#   bash benchmarks/session15.sh third   # compute-sanitizer memcheck and racecheck (sanitize_megakernel.py: with and
#                                        # without evict_first), each tensor its own allocation; the Qwen presets' set
#   bash benchmarks/session15.sh fourth  # the 3B / 8B set and timelines; the timelines of Qwen2.5-0.5B and Qwen3-0.6B
#   bash benchmarks/session15.sh fifth   # sweep r45 (inflight 4 / 6 under evict_first) on the 1B, Qwen2.5-0.5B, the 8B
#   bash benchmarks/session15.sh sixth   # every GPU test, after the in-flight cap (64 KB per SM) became the default
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
second)  # after weight_eviction=auto (evict_first) became the default and the toucher was removed
  gpu_tests
  issue_sets 1b
  waits llama-3.2-1b 55
  ;;
third)
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # memcheck then sees each tensor's own bounds
  sanitize
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
  issue_sets qwen
  ;;
fourth)
  llama_presets
  waits qwen2.5-0.5b 55
  waits qwen3-0.6b 55
  ;;
fifth)
  sweep r45 llama-3.2-1b 128 60
  sweep r45 qwen2.5-0.5b 128 60
  sweep r45 llama-3.1-8b 128 100
  ;;
sixth) gpu_tests ;;  # after inflight=None (64 KB per SM) became the default
qwen) issue_sets qwen ;;
llama) llama_presets ;;
*) echo "session15.sh: unknown stage '${1:-}' (first, second, third, fourth, fifth, sixth, qwen, llama)" >&2; exit 2 ;;
esac
finish
