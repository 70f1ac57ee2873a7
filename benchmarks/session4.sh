#!/usr/bin/env bash
# Fourth session's bounded GPU rounds (run by the lead through the device tool, from the repository root).
#   bash benchmarks/session4.sh tp       # 2 GPUs: NCCL TP tests, Llama-3.1-8B TP=2 and TP=1 diagnose (issue 15),
#                                        # then the issue-13 records (tune curves, ncu counters)
#   bash benchmarks/session4.sh mk SWEEP # megakernel: gluon_check sections + the named sweep (issue 10)
#   bash benchmarks/session4.sh next     # prepared for the next session's first call: GPU tests (launch-ahead
#                                        # path, Qwen3), decode latency with and without launch-ahead, sweep r12
#   bash benchmarks/session4.sh next2    # tile rows on the thin Qwen models (queue balance, issue 14)
# Needs .carry/models/stories260K and .whl/msgspec (carry: .carry .whl). Everything lands under $OUT/run.
. benchmarks/device_prelude.sh
BS="python3 -m bubblescope"
case "${1:-}" in
tp)
  log tp-tests
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_tp.py -p no:cacheprovider > "$R/pytest_tp.log" 2>&1; echo "rc=$?" >> "$R/pytest_tp.log"
  tail -4 "$R/pytest_tp.log"
  log tp2-8b
  timeout 240 $BS diagnose model llama-3.1-8b --tp 2 --out "$R/tp2_llama-3.1-8b" > "$R/tp2.log" 2>&1; echo "rc=$?" >> "$R/tp2.log"
  tail -40 "$R/tp2.log"
  log tp1-8b
  timeout 150 $BS diagnose model llama-3.1-8b --engines reference-cudagraph --out "$R/tp1_llama-3.1-8b" > "$R/tp1.log" 2>&1; echo "rc=$?" >> "$R/tp1.log"
  tail -30 "$R/tp1.log"
  rm -f "$R"/tp*/report.html
  ;;
records)
  log tune-ring
  timeout 200 $BS tune llama-3.2-1b --knob num_stages --values 4,8,12 --contexts 128,4096 --out "$R/tune_ring" --save "$R/tune_ring/tuned.json" > "$R/tune_ring.log" 2>&1; echo "rc=$?" >> "$R/tune_ring.log"
  tail -20 "$R/tune_ring.log"
  log tune-rows
  timeout 200 $BS tune llama-3.2-1b --knob max_rows --values 16,32,64 --contexts 128,4096 --out "$R/tune_rows" > "$R/tune_rows.log" 2>&1; echo "rc=$?" >> "$R/tune_rows.log"
  tail -20 "$R/tune_rows.log"
  log counters
  timeout 280 $BS diagnose model llama-3.2-1b --engines megakernel,megakernel-triton,reference-compile --counters --out "$R/counters" > "$R/counters.log" 2>&1; echo "rc=$?" >> "$R/counters.log"
  tail -40 "$R/counters.log"
  rm -f "$R"/counters/report.html
  ;;
r9)
  log r9-check-128
  timeout 330 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r9.json" --sections stories,sweep,timeline --tokens 100 --sweep r9 --timed 200 --rounds 5 --params '{"wait_prefetch": 8}' > "$R/gluon_check_r9.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r9.log"
  tail -30 "$R/gluon_check_r9.log"
  log r9-4096
  timeout 200 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r9long.json" --sections sweep --sweep r9long --context 4096 --timed 100 --rounds 5 > "$R/gluon_check_r9long.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r9long.log"
  tail -12 "$R/gluon_check_r9long.log"
  ;;
r10)
  log r10-check
  timeout 300 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r10.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r10 --timed 200 --rounds 5 > "$R/gluon_check_r10.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r10.log"
  tail -30 "$R/gluon_check_r10.log" | cut -c1-1500
  log decode-latency-1b
  timeout 230 python3 benchmarks/decode_latency.py --engines reference-compile,megakernel-triton,megakernel,megakernel-noprefetch --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 210 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -14 "$R/decode_latency_1b.log"
  ;;
final)
  log decode-latency-1b
  timeout 140 python3 benchmarks/decode_latency.py --engines reference-compile,megakernel-triton,megakernel,megakernel-noprefetch --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 125 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -9 "$R/decode_latency_1b.log"
  log gpu-tests
  timeout 170 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider -x > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -12 "$R/pytest_gpu.log"
  log decode-latency-qwen
  timeout 100 python3 benchmarks/decode_latency.py --models qwen3-0.6b,qwen2.5-0.5b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_qwen.json" --max-seconds 90 > "$R/decode_latency_qwen.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_qwen.log"
  tail -9 "$R/decode_latency_qwen.log"
  log counters
  timeout 100 $BS diagnose model llama-3.2-1b --engines megakernel --counters --out "$R/counters" > "$R/counters.log" 2>&1; echo "rc=$?" >> "$R/counters.log"
  tail -25 "$R/counters.log"
  rm -f "$R"/counters/report.html
  log ncu-csv
  cmd=$(python3 -c "import shlex; from bubblescope.profiler.ncu import ncu_command, find_ncu; from bubblescope.counters import generate_argv; print(shlex.join(ncu_command(find_ncu(), generate_argv('llama-3.2-1b', 'megakernel', 'cuda', 'bfloat16', 0), 16, 1, 'megakernel')))")
  echo "$cmd" > "$R/ncu_megakernel.cmd"
  timeout 50 $cmd > "$R/ncu_megakernel.csv" 2> "$R/ncu_megakernel.err"; echo "rc=$?" >> "$R/ncu_megakernel.err"
  tail -3 "$R/ncu_megakernel.err"; wc -l "$R/ncu_megakernel.csv"
  ;;
next)
  log gpu-tests
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider -x > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -8 "$R/pytest_gpu.log"
  log decode-latency-ahead
  timeout 170 python3 benchmarks/decode_latency.py --engines reference-compile,megakernel-triton,megakernel,megakernel@stepwise --long-context-engines megakernel --out "$R/decode_latency_ahead.json" --max-seconds 150 > "$R/decode_latency_ahead.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_ahead.log"
  tail -9 "$R/decode_latency_ahead.log"
  log r12
  timeout 200 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r12.json" --sections stories,sweep --tokens 100 --sweep r12 --timed 300 --rounds 6 > "$R/gluon_check_r12.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r12.log"
  tail -12 "$R/gluon_check_r12.log" | cut -c1-400
  ;;
next2)
  for m in qwen3-0.6b qwen2.5-0.5b; do
    log rows-$m
    timeout 140 python3 benchmarks/gluon_check.py --model $m --out "$R/gluon_check_rows_$m.json" --sections sweep,timeline --sweep rows --timed 200 --rounds 5 > "$R/gluon_check_rows_$m.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_rows_$m.log"
    tail -8 "$R/gluon_check_rows_$m.log" | cut -c1-300
  done
  ;;
mk)
  log gluon-check
  timeout 420 python3 benchmarks/gluon_check.py --out "$R/gluon_check_${2:-none}.json" ${MK_ARGS:-} --sweep "${2:-none}" > "$R/gluon_check.log" 2>&1; echo "rc=$?" >> "$R/gluon_check.log"
  tail -80 "$R/gluon_check.log"
  ;;
esac
find "$R" -type f | head -50
(cd "$R/.." && tar czf run.tgz run)
