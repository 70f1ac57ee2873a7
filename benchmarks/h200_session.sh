#!/usr/bin/env bash
# One bounded GPU session (run by the lead through the device tool, from the repository root):
#   bash benchmarks/h200_session.sh check   # GPU tests, megakernel check + sweep, test traces, sanitizers
#   bash benchmarks/h200_session.sh tune    # GPU tests and the megakernel check only (MK_ARGS passes flags)
#   bash benchmarks/h200_session.sh final-a # decode-latency benchmarks (llama-3.2-1b all engines; 3b, qwen3-0.6b)
#   bash benchmarks/h200_session.sh final-b # `bubblescope diagnose model` on the built-in default
#   bash benchmarks/h200_session.sh round4  # megakernel check + tune4 sweep (context 128), attn4 sweep (4096), sanitizers
#   bash benchmarks/h200_session.sh round5  # the same with the tune5 / attn5 sweeps, then the GPU tests
#   bash benchmarks/h200_session.sh round6  # short check + tune6 / attn6 sweeps, then decode latency (llama-3.2-1b)
#   bash benchmarks/h200_session.sh round6b # decode latency of llama-3.2-3b / qwen3-0.6b, diagnose, racecheck
#   bash benchmarks/h200_session.sh round7  # attention sweep attn7 at contexts 4096 and 128
#   bash benchmarks/h200_session.sh round8  # decode latency (llama-3.2-1b) and diagnose with the final defaults
# Pass BUBBLESCOPE_COMMIT=<sha> (the copied tree's .git may be stale) so the JSON records the right commit.
# Everything lands under $OUT/run and is packed into $OUT/run.tgz (the device returns at most 8 files).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bubblescope-session}
R=$OUT/run
mkdir -p "$R"
log() { echo "=== $* $(date +%T)"; }
stage=${1:-check}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.mem --format=csv
  python3 -c "import torch,triton,transformers,pandas,matplotlib;print('torch',torch.__version__,'triton',triton.__version__,'transformers',transformers.__version__,'pandas',pandas.__version__,'mpl',matplotlib.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
if [ "$stage" = check ] || [ "$stage" = tune ]; then
  log gpu-tests
  timeout 170 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -5 "$R/pytest_gpu.log"
  log megakernel-check
  timeout 250 python3 benchmarks/megakernel_gpu_check.py --out "$R/megakernel_check.json" --max-seconds 220 ${MK_ARGS:-} > "$R/mk_check.log" 2>&1; echo "rc=$?" >> "$R/mk_check.log"
  tail -60 "$R/mk_check.log"
fi
if [ "$stage" = check ]; then
  log traces
  timeout 60 python3 benchmarks/record_test_traces.py --out "$R/tracedata" > "$R/traces.log" 2>&1; echo "rc=$?" >> "$R/traces.log"
  tail -4 "$R/traces.log"
  log sanitizers
  for tool in memcheck racecheck; do
    timeout 45 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_megakernel.py > "$R/sanitizer_$tool.log" 2>&1; echo "rc=$?" >> "$R/sanitizer_$tool.log"
    tail -6 "$R/sanitizer_$tool.log"
  done
elif [ "$stage" = round4 ] || [ "$stage" = round5 ]; then
  n=${stage#round}
  log megakernel-check-tune$n
  timeout 330 python3 benchmarks/megakernel_gpu_check.py --out "$R/megakernel_check_round$n.json" --max-seconds 300 --reference-modes eager,fp32,cudagraph --steps 256 --sweep tune$n ${MK_ARGS:-} > "$R/megakernel_check_round$n.log" 2>&1; echo "rc=$?" >> "$R/megakernel_check_round$n.log"
  tail -70 "$R/megakernel_check_round$n.log"
  log attn$n-4096
  timeout 110 python3 benchmarks/megakernel_gpu_check.py --out "$R/mk_attn${n}_4096.json" --max-seconds 95 --sections sweep --sweep attn$n --context 4096 --timed-steps 40 --reference-modes eager > "$R/mk_attn${n}_4096.log" 2>&1; echo "rc=$?" >> "$R/mk_attn${n}_4096.log"
  tail -10 "$R/mk_attn${n}_4096.log"
  log sanitizers
  for tool in memcheck racecheck; do
    timeout 70 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_megakernel.py > "$R/sanitizer_$tool.log" 2>&1; echo "rc=$?" >> "$R/sanitizer_$tool.log"
    tail -10 "$R/sanitizer_$tool.log"
  done
  if [ "$stage" = round5 ]; then
    log gpu-tests
    timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
    tail -8 "$R/pytest_gpu.log"
  fi
elif [ "$stage" = round6 ]; then
  log megakernel-check-tune6
  timeout 200 python3 benchmarks/megakernel_gpu_check.py --out "$R/megakernel_check_round6.json" --max-seconds 180 --reference-modes eager,fp32 --steps 128 --variants fused,noprefetch --sweep tune6 > "$R/megakernel_check_round6.log" 2>&1; echo "rc=$?" >> "$R/megakernel_check_round6.log"
  tail -40 "$R/megakernel_check_round6.log"
  log attn6-4096
  timeout 90 python3 benchmarks/megakernel_gpu_check.py --out "$R/mk_attn6_4096.json" --max-seconds 75 --sections sweep --sweep attn6 --context 4096 --timed-steps 40 --reference-modes eager > "$R/mk_attn6_4096.log" 2>&1; echo "rc=$?" >> "$R/mk_attn6_4096.log"
  tail -8 "$R/mk_attn6_4096.log"
  log decode-latency-1b
  timeout 270 python3 benchmarks/decode_latency.py --out "$R/decode_latency_1b.json" --max-seconds 250 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -14 "$R/decode_latency_1b.log"
elif [ "$stage" = round7 ]; then
  for ctx in 4096 128; do
    log attn7-$ctx
    timeout 100 python3 benchmarks/megakernel_gpu_check.py --out "$R/mk_attn7_$ctx.json" --max-seconds 90 --sections sweep --sweep attn7 --context $ctx --timed-steps 40 --reference-modes eager > "$R/mk_attn7_$ctx.log" 2>&1; echo "rc=$?" >> "$R/mk_attn7_$ctx.log"
    tail -9 "$R/mk_attn7_$ctx.log"
  done
elif [ "$stage" = round8 ]; then
  log decode-latency-1b
  timeout 200 python3 benchmarks/decode_latency.py --out "$R/decode_latency_1b.json" --max-seconds 180 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -10 "$R/decode_latency_1b.log"
  log diagnose
  timeout 230 python3 -m bubblescope diagnose model --out "$R/diagnose" ${DG_ARGS:-} > "$R/diagnose.log" 2>&1; echo "rc=$?" >> "$R/diagnose.log"
  sed -n 10,40p "$R/diagnose.log"
elif [ "$stage" = round6b ]; then
  log decode-latency-others
  timeout 200 python3 benchmarks/decode_latency.py --models llama-3.2-3b,qwen3-0.6b --engines reference-cudagraph,reference-compile,megakernel --runs 2 --gen-len 128 --long-contexts "" --out "$R/decode_latency_others.json" --max-seconds 180 > "$R/decode_latency_others.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_others.log"
  tail -10 "$R/decode_latency_others.log"
  log diagnose
  timeout 250 python3 -m bubblescope diagnose model --out "$R/diagnose" ${DG_ARGS:-} > "$R/diagnose.log" 2>&1; echo "rc=$?" >> "$R/diagnose.log"
  tail -40 "$R/diagnose.log"
  timeout 60 compute-sanitizer --tool racecheck --print-limit 10 python3 benchmarks/sanitize_megakernel.py > "$R/sanitizer_racecheck.log" 2>&1; echo "rc=$?" >> "$R/sanitizer_racecheck.log"
  tail -3 "$R/sanitizer_racecheck.log"
elif [ "$stage" = final-a ]; then
  log decode-latency-1b
  timeout 260 python3 benchmarks/decode_latency.py --out "$R/decode_latency_1b.json" --max-seconds 230 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -12 "$R/decode_latency_1b.log"
  log decode-latency-others
  timeout 200 python3 benchmarks/decode_latency.py --models llama-3.2-3b,qwen3-0.6b --engines reference,reference-cudagraph,reference-compile,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_others.json" --max-seconds 170 > "$R/decode_latency_others.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_others.log"
  tail -10 "$R/decode_latency_others.log"
elif [ "$stage" = final-b ]; then
  log diagnose
  timeout 540 python3 -m bubblescope diagnose model --out "$R/diagnose" ${DG_ARGS:-} > "$R/diagnose.log" 2>&1; echo "rc=$?" >> "$R/diagnose.log"
  tail -60 "$R/diagnose.log"
fi
log pack
tar czf "$OUT/run.tgz" -C "$OUT" run && ls -la "$OUT/run.tgz"
