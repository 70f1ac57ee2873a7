#!/usr/bin/env bash
# Prepared in session 16 for the seventeenth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT as the full sha from this machine, not $(git rev-parse HEAD) on the
# device, whose checkout's HEAD is not the working tree; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session17.sh first   # every GPU test, then compute-sanitizer memcheck and racecheck on the tiny
#                                        # models (last run at bb76aef, before the in-flight cap); ~450 s
#   bash benchmarks/session17.sh second  # benchmarks/atomic_probe.py with 20 launches per timed sample (session 16's
#                                        # numbers are upper bounds); the 1B's decode-latency set
. benchmarks/device_prelude.sh
case "${1:-}" in
first)
  gpu_tests
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # memcheck then sees each tensor's own bounds
  sanitize
  ;;
second)
  log "atomic probe"
  timeout 60 python3 benchmarks/atomic_probe.py --out "$R/atomic_probe.json" > "$R/atomic_probe.log" 2>&1; echo "rc=$?" >> "$R/atomic_probe.log"
  cat "$R/atomic_probe.log"
  issue_sets 1b
  ;;
*) echo "session17.sh: unknown stage '${1:-}' (first, second)" >&2; exit 2 ;;
esac
finish
