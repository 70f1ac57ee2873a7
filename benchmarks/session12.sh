#!/usr/bin/env bash
# Prepared in session 11 for the twelfth session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session12.sh mma     # mv_widen=mma (built in session 12): GPU test, the 1B's check, r36 / r36q
#   bash benchmarks/session12.sh r37     # sig_gate 6 / -1 with mv_widen=mma (1B, Qwen2.5 at 32 rows), then waits
#   bash benchmarks/session12.sh last    # every GPU test on the landed kernel, then r38 / r38q (mma, two boxes a slot)
#   bash benchmarks/session12.sh first   # every GPU test (attn_reduce=oproj was removed after the last GPU run;
#                                        # the default kernel's PTX is unchanged, compared offline), then the
#                                        # instruction-cache check (icache)
#   bash benchmarks/session12.sh r34     # the gates and the L2 prefetch past the ring, re-measured on this
#                                        # kernel, on the 1B, Qwen2.5 and the 8B
#   bash benchmarks/session12.sh warps   # attn_layout=mma-warps: measured in session 12 (sweeps r35 / r35long),
#                                        # lost on every model and removed since; the stage only says so
#   bash benchmarks/session12.sh icache  # ncu's warp-stall reasons for one decode step of the 1B: the default
#                                        # kernel (93 KB of SASS) and e6b2920's attn_reduce=oproj (170 KB; needs
#                                        # .carry/src_e6b2920.tar = `git archive e6b2920 src`), whose untouched
#                                        # phases ran ~2x slower in session 11: is it the instruction cache?
#   bash benchmarks/session12.sh sanitize # compute-sanitizer memcheck / racecheck
#   bash benchmarks/session12.sh waits   # timelines of the 3B, 8B and Qwen3-1.7B (README wait ratios: session 8's)
. benchmarks/device_prelude.sh
icache() {
  local metrics
  metrics=$(python3 -c "from bubblescope.profiler.ncu import METRICS; print(','.join(METRICS))")
  for tag in default oproj; do
    local src=src P='{}'
    if [ $tag = oproj ]; then
      [ -f .carry/src_e6b2920.tar ] || { echo "icache: .carry/src_e6b2920.tar missing, oproj skipped"; continue; }
      mkdir -p /tmp/old && tar xf .carry/src_e6b2920.tar -C /tmp/old && src=/tmp/old/src P='{"attn_reduce": "oproj"}'
    fi
    log "ncu $tag"
    PYTHONPATH=$src:/tmp/site timeout 150 ncu --csv --print-units base --clock-control none --target-processes all \
      --launch-skip 16 --launch-count 1 -k regex:megakernel --metrics "$metrics" \
      python3 benchmarks/ncu_target.py llama-3.2-1b "$P" > "$R/ncu_$tag.csv" 2> "$R/ncu_$tag.err"
    echo "rc=$?" >> "$R/ncu_$tag.err"
    python3 -c "
import sys
from bubblescope.profiler.ncu import parse_ncu_csv
rows = parse_ncu_csv(open(sys.argv[1]).read())
print({r['metric'].replace('smsp__warp_issue_stalled_', '').replace('_per_warp_active.pct', ''): r['value'] for r in rows})
" "$R/ncu_$tag.csv" 2>&1 | tail -2
  done
}
case "${1:-}" in
mma)  # mv_widen=mma (session 12): its GPU test, the 1B's check (frames kept), sweeps r36 / r36q
  log gpu-tests-mma
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -k "tensor_core_matvec" -p no:cacheprovider > "$R/pytest_gpu_mma.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu_mma.log"
  tail -4 "$R/pytest_gpu_mma.log"
  gluon_check_params llama-3.2-1b mma '{"mv_widen": "mma"}'
  keep_frames gluon_check_mma
  sweep r36 llama-3.2-1b 128 70
  sweep r36 qwen3-0.6b 128 60
  sweep r36q qwen2.5-0.5b 128 70
  sweep r36 llama-3.1-8b 128 110
  ;;
r37)  # the signal gate with the tensor-core matvec, then the README's session-8 wait ratios
  sweep r37 llama-3.2-1b 128 80
  sweep r37q qwen2.5-0.5b 128 80
  waits llama-3.2-3b 55
  waits llama-3.1-8b 65
  waits qwen3-1.7b 55
  ;;
last)  # every GPU test on the landed kernel, then two boxes per slot with the tensor-core matvec (r38 / r38q)
  gpu_tests
  sweep r38 llama-3.2-1b 128 60
  sweep r38q qwen2.5-0.5b 128 60
  ;;
first)
  gpu_tests
  icache
  ;;
r34)
  sweep r34 llama-3.2-1b 128 70
  sweep r34 qwen2.5-0.5b 128 60
  sweep r34 llama-3.1-8b 128 120
  ;;
icache) icache ;;
sanitize) sanitize ;;
waits)  # one step's timeline of the presets whose README wait ratio is still session 8's
  waits llama-3.2-3b 55
  waits llama-3.1-8b 65
  waits qwen3-1.7b 55
  ;;
warps)  # attn_layout=mma-warps, removed after its session-12 measurement
  echo "session12.sh: attn_layout=mma-warps was removed after its session-12 measurement (sweeps r35 / r35long:" \
    "it lost on every model); nothing to run" >&2
  exit 2
  ;;
*) echo "session12.sh: unknown stage '${1:-}' (mma, r37, last, first, r34, icache, warps, sanitize, waits)" >&2; exit 2 ;;
esac
finish
