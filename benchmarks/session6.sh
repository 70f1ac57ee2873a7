#!/usr/bin/env bash
# Sixth session's bounded GPU rounds (run by the lead through the device tool, from the repository root).
#   bash benchmarks/session6.sh check     # the 8B argmax mismatch analysed (gluon_check llama section), issue 10's
#                                         # decode latency set on the new defaults (lm_pick=cta, attn_layout=auto),
#                                         # the GPU tests but the 8B argmax one
#   bash benchmarks/session6.sh phases    # the 8B argmax test (its new bar); timelines with the weight tasks' phase
#                                         # stamps (llama-3.2-1b, qwen3-0.6b, llama-3.1-8b)
#   (stage r16, mv_unroll=2, ran at 6e26389; its switch was removed)
#   bash benchmarks/session6.sh r17       # sig_gate (the producer held back until a stage's signal is out) and a
#                                         # 6-slot ring: correctness, A/B and phases on llama-3.2-1b; A/B on qwen3-0.6b
#   bash benchmarks/session6.sh last      # final: issue 10's decode latency set and every GPU test; then sweep r18
#                                         # (sig_gate's neighbours) on llama-3.2-1b
#   bash benchmarks/session6.sh presets   # decode latency of the other presets (README table)
#   bash benchmarks/session6.sh tests     # every GPU test
#   bash benchmarks/session6.sh mk SWEEP  # megakernel: gluon_check sweep SWEEP (MK_ARGS adds options)
# Needs .carry/models/stories260K and .whl/msgspec (carry: .carry .whl). Everything lands under $OUT/run.
. benchmarks/device_prelude.sh
DL="python3 benchmarks/decode_latency.py"
case "${1:-}" in
check)
  log argmax-8b
  timeout 170 python3 benchmarks/gluon_check.py --model llama-3.1-8b --out "$R/gluon_check_8b_argmax.json" --sections llama --steps 256 > "$R/gluon_check_8b_argmax.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_8b_argmax.log"
  tail -3 "$R/gluon_check_8b_argmax.log" | cut -c1-1500
  log decode-latency-1b
  timeout 150 $DL --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 135 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -10 "$R/decode_latency_1b.log"
  log gpu-tests
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider -k "not llama-3.1-8b" > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -8 "$R/pytest_gpu.log"
  ;;
phases)
  log test-8b
  timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider -k "argmax and llama-3.1-8b" > "$R/pytest_gpu_8b.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu_8b.log"
  tail -4 "$R/pytest_gpu_8b.log"
  for m in llama-3.2-1b qwen3-0.6b llama-3.1-8b; do
    log phases-$m
    timeout 80 python3 benchmarks/gluon_check.py --model $m --out "$R/phases_$m.json" --sections timeline > "$R/phases_$m.log" 2>&1; echo "rc=$?" >> "$R/phases_$m.log"
    grep -E "megakernel-gluon |rc=" "$R/phases_$m.log" | cut -c1-300
  done
  ;;
r17)
  log r17
  timeout 280 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r17.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r17 --timed 300 --rounds 6 --params '{"sig_gate": 2}' > "$R/gluon_check_r17.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r17.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_r17.log" | grep -v "^timeline" | tail -36 | cut -c1-330
  log r17-qwen3
  timeout 110 python3 benchmarks/gluon_check.py --model qwen3-0.6b --out "$R/gluon_check_r17_qwen3.json" --sections sweep --sweep r17 --timed 150 --rounds 4 > "$R/gluon_check_r17_qwen3.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r17_qwen3.log"
  tail -9 "$R/gluon_check_r17_qwen3.log" | cut -c1-330
  ;;
last)
  log decode-latency-1b
  timeout 150 $DL --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 135 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -7 "$R/decode_latency_1b.log"
  log gpu-tests
  timeout 220 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -5 "$R/pytest_gpu.log"
  log r18
  timeout 100 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r18.json" --sections sweep --sweep r18 --timed 200 --rounds 4 > "$R/gluon_check_r18.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r18.log"
  tail -10 "$R/gluon_check_r18.log" | cut -c1-300
  ;;
presets)
  log decode-latency-llama
  timeout 200 $DL --models llama-3.2-3b,llama-3.1-8b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_llama.json" --max-seconds 185 > "$R/decode_latency_llama.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_llama.log"
  tail -10 "$R/decode_latency_llama.log"
  log decode-latency-qwen
  timeout 230 $DL --models qwen2.5-0.5b,qwen3-0.6b,qwen3-1.7b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_qwen.json" --max-seconds 210 > "$R/decode_latency_qwen.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_qwen.log"
  tail -14 "$R/decode_latency_qwen.log"
  ;;
tests)
  log gpu-tests
  timeout 400 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -8 "$R/pytest_gpu.log"
  ;;
mk)
  log gluon-check
  timeout 420 python3 benchmarks/gluon_check.py --out "$R/gluon_check_${2:-none}.json" ${MK_ARGS:-} --sweep "${2:-none}" > "$R/gluon_check.log" 2>&1; echo "rc=$?" >> "$R/gluon_check.log"
  tail -40 "$R/gluon_check.log" | cut -c1-400
  ;;
esac
rm -f "$R"/*noprefetch_frame.csv.gz
find "$R" -type f | head -60
(cd "$R/.." && tar czf run.tgz run)
