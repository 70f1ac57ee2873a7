#!/usr/bin/env bash
# Prepared in session 15 for the sixteenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session16.sh first   # every GPU test with the in-flight cap the default (session 15's run stopped
#                                        # at the device-time limit after 27 of 38); the 1B's decode-latency set;
#                                        # `diagnose model` on the 1B's megakernels (its wait ratio, and the
#                                        # weight-stream feed's first GPU run in the product); ~550 s
#   bash benchmarks/session16.sh second  # sweep r47 (kv_prefetch: the next attention task's K/V asked of L2 ahead;
#                                        # the GPU tests of `first` checked it) on the 1B at 4096 and 128; sweep r46
#                                        # (the in-flight cap against none) on Qwen3-0.6B and the 3B
#   bash benchmarks/session16.sh third   # the Qwen presets' and the 3B / 8B decode-latency sets (2 runs each)
#   bash benchmarks/session16.sh fourth  # compute-sanitizer memcheck and racecheck (tiny models, every form)
#   bash benchmarks/session16.sh fifth   # fuse_down: its GPU test form, the 1B's check, fp32 checks, sweep r48
#   bash benchmarks/session16.sh sixth   # fuse_down with 8 / 32 accumulator copies: the 1B's check, sweep r49
#   bash benchmarks/session16.sh seventh # benchmarks/atomic_probe.py: float32 atomics from every SM
# (second ran at 20f7a01, fifth and sixth at d80864d and 67cc0dc; kv_prefetch, fuse_down and down_copies were removed
# after them, so their sweeps no longer run)
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  issue_sets 1b
  # the product's own view (its wait ratio too) of the 1B's megakernel, with session 15's weight-stream feed (intrakernel.stream_feed)
  log "diagnose model llama-3.2-1b"
  timeout 150 python3 -m bubblescope diagnose model llama-3.2-1b --engines megakernel,megakernel-noprefetch \
    --runs 1 --out "$R/diagnose_1b" > "$R/diagnose_1b.log" 2>&1; echo "rc=$?" >> "$R/diagnose_1b.log"
  grep -iE "weight stream|megakernel|rc=" "$R/diagnose_1b.log" | head -12
  ;;
second)  # trimmed in session 16 (device time for a new lever): r47 on the 1B, r46 on Qwen3-0.6B and the 3B
  sweep r47 llama-3.2-1b 4096 60
  sweep r47 llama-3.2-1b 128 45
  sweep r46 qwen3-0.6b 128 50
  sweep r46 llama-3.2-3b 128 70
  ;;
third)  # the Qwen and larger Llama presets' decode-latency sets with the in-flight cap (none ran with it yet)
  issue_sets qwen
  issue_sets llama
  ;;
fourth)
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # memcheck then sees each tensor's own bounds
  sanitize
  ;;
fifth)  # fuse_down (prepared this session): its GPU test form, the 1B's check, stories260K and the tiny fp32 models,
  # then sweep r48 against the default
  log "gpu-tests fuse_down"
  timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -k "other_forms" -p no:cacheprovider > "$R/pytest_gpu_fd.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu_fd.log"
  tail -4 "$R/pytest_gpu_fd.log"
  gluon_check_params llama-3.2-1b fd '{"fuse_down": true}'
  fp32_check fd '{"fuse_down": true}'
  sweep r48 llama-3.2-1b 128 45
  sweep r48 qwen3-0.6b 128 50
  sweep r48 llama-3.2-1b 4096 60
  sweep r48 llama-3.1-8b 128 100
  ;;
sixth)  # r48 lost (the fused down's atomics: 512 gate-up tasks a layer into the same floats): the adds spread over
  # 8 and 32 accumulator copies (down_copies)
  gluon_check_params llama-3.2-1b fdc8 '{"fuse_down": true, "down_copies": 8}'
  sweep r49 llama-3.2-1b 128 60
  sweep r49 qwen3-0.6b 128 60
  ;;
seventh)  # why fuse_down lost: every SM adding float32 partials with atomics, alone (benchmarks/atomic_probe.py)
  log "atomic probe"
  timeout 60 python3 benchmarks/atomic_probe.py --out "$R/atomic_probe.json" > "$R/atomic_probe.log" 2>&1; echo "rc=$?" >> "$R/atomic_probe.log"
  cat "$R/atomic_probe.log"
  ;;
*) echo "session16.sh: unknown stage '${1:-}' (first, second, third, fourth, fifth, sixth, seventh)" >&2; exit 2 ;;
esac
finish
