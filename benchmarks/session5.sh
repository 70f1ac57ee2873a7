#!/usr/bin/env bash
# Fifth session's bounded GPU rounds (run by the lead through the device tool, from the repository root).
#   bash benchmarks/session5.sh chain     # per-task timelines (whole frames) of llama-3.2-1b, qwen2.5-0.5b, qwen3-0.6b
#                                         # for the dependency-chain analysis; decode latency of the Qwen presets
#   bash benchmarks/session5.sh presets   # decode latency and timeline of llama-3.2-3b and llama-3.1-8b
#   (stages r13 and r14 ran at cadb963 and c2f4963; their switches were removed since: `git show c2f4963:benchmarks/session5.sh`)
#   bash benchmarks/session5.sh phases    # timelines with the attention tasks' phase stamps (llama-3.2-1b, qwen3-0.6b)
#   bash benchmarks/session5.sh next      # the next session's first call (prepared, not run): lm_pick and
#                                         # attn_layout checks and A/B
#   bash benchmarks/session5.sh next-tests  # the GPU tests, every preset's argmax check among them
#   bash benchmarks/session5.sh mk SWEEP  # megakernel: gluon_check sweep SWEEP (MK_ARGS adds options)
#   bash benchmarks/session5.sh final     # issue 10's decode latency set with launch-ahead, GPU tests
#   bash benchmarks/session5.sh last      # final, then presets (one device call)
# Needs .carry/models/stories260K and .whl/msgspec (carry: .carry .whl). Everything lands under $OUT/run.
. benchmarks/device_prelude.sh
DL="python3 benchmarks/decode_latency.py"
case "${1:-}" in
chain)
  for m in llama-3.2-1b qwen2.5-0.5b qwen3-0.6b; do
    log timeline-$m
    timeout 100 python3 benchmarks/gluon_check.py --model $m --out "$R/chain_$m.json" --sections timeline > "$R/chain_$m.log" 2>&1; echo "rc=$?" >> "$R/chain_$m.log"
    grep -E "megakernel-gluon |rc=" "$R/chain_$m.log" | cut -c1-200
  done
  log decode-latency-qwen
  timeout 230 $DL --models qwen2.5-0.5b,qwen3-0.6b,qwen3-1.7b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_qwen.json" --max-seconds 210 > "$R/decode_latency_qwen.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_qwen.log"
  tail -14 "$R/decode_latency_qwen.log"
  ;;
presets)
  log decode-latency-llama
  timeout 200 $DL --models llama-3.2-3b,llama-3.1-8b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_llama.json" --max-seconds 185 > "$R/decode_latency_llama.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_llama.log"
  tail -10 "$R/decode_latency_llama.log"
  for m in llama-3.2-3b llama-3.1-8b; do
    log timeline-$m
    timeout 50 python3 benchmarks/gluon_check.py --model $m --out "$R/chain_$m.json" --sections timeline > "$R/chain_$m.log" 2>&1; echo "rc=$?" >> "$R/chain_$m.log"
    grep -E "rc=" "$R/chain_$m.log"
  done
  ;;
phases)
  for m in llama-3.2-1b qwen3-0.6b; do
    log phases-$m
    timeout 70 python3 benchmarks/gluon_check.py --model $m --out "$R/phases_$m.json" --sections timeline > "$R/phases_$m.log" 2>&1; echo "rc=$?" >> "$R/phases_$m.log"
    grep -E "megakernel-gluon |rc=" "$R/phases_$m.log" | cut -c1-300
  done
  rm -f "$R"/*noprefetch_frame.csv.gz
  ;;
next)
  # prepared for the sixth session's first call: correctness of lm_pick=cta with attn_layout=warps (stories, tiny, llama sections); their A/B on the 1B (also at 4096) and
  # on Qwen2.5-0.5B (9,496 LM-head tasks)
  log r15
  timeout 260 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r15.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r15 --timed 300 --rounds 6 --params '{"lm_pick": "cta", "attn_layout": "warps"}' > "$R/gluon_check_r15.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r15.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_r15.log" | tail -20 | cut -c1-500
  log r15-qwen25
  timeout 100 python3 benchmarks/gluon_check.py --model qwen2.5-0.5b --out "$R/gluon_check_r15_qwen25.json" --sections sweep --sweep r15 --timed 200 --rounds 5 > "$R/gluon_check_r15_qwen25.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r15_qwen25.log"
  tail -7 "$R/gluon_check_r15_qwen25.log" | cut -c1-300
  log r15-4096
  timeout 110 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r15long.json" --sections sweep --sweep r15long --context 4096 --timed 100 --rounds 5 > "$R/gluon_check_r15long.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r15long.log"
  tail -6 "$R/gluon_check_r15long.log" | cut -c1-300
  rm -f "$R"/*noprefetch_frame.csv.gz
  ;;
next-tests)
  log gpu-tests
  timeout 400 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -8 "$R/pytest_gpu.log"
  ;;
mk)
  log gluon-check
  timeout 420 python3 benchmarks/gluon_check.py --out "$R/gluon_check_${2:-none}.json" ${MK_ARGS:-} --sweep "${2:-none}" > "$R/gluon_check.log" 2>&1; echo "rc=$?" >> "$R/gluon_check.log"
  tail -40 "$R/gluon_check.log" | cut -c1-400
  ;;
last)
  bash "$0" final
  bash "$0" presets
  exit 0
  ;;
final)
  log decode-latency-1b
  timeout 150 $DL --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 135 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -10 "$R/decode_latency_1b.log"
  log gpu-tests
  timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider -x > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -8 "$R/pytest_gpu.log"
  ;;
esac
find "$R" -type f | head -60
(cd "$R/.." && tar czf run.tgz run)
