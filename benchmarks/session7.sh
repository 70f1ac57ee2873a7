#!/usr/bin/env bash
# Prepared in session 6 for the seventh session's first device calls (from the repository root, through the
# device tool; carry .carry .whl; everything lands under $OUT/run):
#   bash benchmarks/session7.sh next    # mv_widen=bits: correctness (stories, tiny, llama sections) and timeline
#                                       # phases; sweep r19 (bits, sig_gate 3) on llama-3.2-1b and qwen3-0.6b; then
#                                       # every GPU test (the default matvec was refactored after the last GPU run:
#                                       # its SASS has the same length, reordered)
#   bash benchmarks/session7.sh r20     # attn_gate: correctness (stories, tiny, llama sections, timeline phases)
#                                       # with attn_gate=2; sweep r20 on llama-3.2-1b and qwen3-0.6b
#   bash benchmarks/session7.sh r21     # sweep r21 (sig_gate 3 + attn_gate 0, 64-position splits) on the 1B and
#                                       # Qwen3-0.6B; r21short on Qwen2.5-0.5B and Llama-3.1-8B
#   bash benchmarks/session7.sh r22     # attn_sync=tagged: correctness and timeline (1B), sweep r22 on the 1B (128
#                                       # and 4096 context) and Qwen3-0.6B; every GPU test on the new defaults
#   bash benchmarks/session7.sh final   # issue 10's decode-latency set on the 1B (and 4096 context), the Qwen presets
#   bash benchmarks/session7.sh waits   # one step's intra-kernel timeline (wait ratio, edges) of six presets
#   bash benchmarks/session7.sh attn    # the attention task's new stamps (q in, blocks done): timelines of the 1B,
#                                       # Qwen3-0.6B and Qwen2.5-0.5B
#   bash benchmarks/session7.sh tests   # every GPU test
#   bash benchmarks/session7.sh presets # decode latency of the 3B and 8B (the README rows from session 5) on the
#                                       # current defaults
. benchmarks/device_prelude.sh
DL="python3 benchmarks/decode_latency.py"
case "${1:-}" in
next)
  log r19
  timeout 280 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r19.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r19 --timed 300 --rounds 6 --params '{"mv_widen": "bits"}' > "$R/gluon_check_r19.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r19.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_r19.log" | grep -v "^timeline" | tail -34 | cut -c1-330
  log r19-qwen3
  timeout 110 python3 benchmarks/gluon_check.py --model qwen3-0.6b --out "$R/gluon_check_r19_qwen3.json" --sections sweep --sweep r19 --timed 150 --rounds 4 > "$R/gluon_check_r19_qwen3.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r19_qwen3.log"
  tail -8 "$R/gluon_check_r19_qwen3.log" | cut -c1-330
  log gpu-tests
  timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -6 "$R/pytest_gpu.log"
  ;;
r20)
  log r20
  timeout 250 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r20.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r20 --timed 270 --rounds 6 --params '{"attn_gate": 2}' > "$R/gluon_check_r20.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r20.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_r20.log" | grep -v "^timeline" | tail -36 | cut -c1-330
  log r20-qwen3
  timeout 130 python3 benchmarks/gluon_check.py --model qwen3-0.6b --out "$R/gluon_check_r20_qwen3.json" --sections sweep --sweep r20 --timed 180 --rounds 6 > "$R/gluon_check_r20_qwen3.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r20_qwen3.log"
  tail -11 "$R/gluon_check_r20_qwen3.log" | cut -c1-330
  ;;
r21)
  for m in llama-3.2-1b:r21:200:110 qwen3-0.6b:r21:200:110 qwen2.5-0.5b:r21short:150:80 llama-3.1-8b:r21short:60:200; do
    IFS=: read -r model sweep timed limit <<< "$m"
    log "r21 $model"
    timeout "$limit" python3 benchmarks/gluon_check.py --model "$model" --out "$R/gluon_check_r21_$model.json" --sections sweep --sweep "$sweep" --timed "$timed" --rounds 5 > "$R/gluon_check_r21_$model.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r21_$model.log"
    grep -E "ms_p50|rc=" "$R/gluon_check_r21_$model.log" | sed -E 's/"registers.*"ms_p50": ([0-9.]+).*"round_medians_ms": \[([^]]*)\].*/p50 \1 rounds \2/' | cut -c1-250
  done
  ;;
r22)
  log r22
  timeout 200 python3 benchmarks/gluon_check.py --out "$R/gluon_check_r22.json" --sections stories,tiny,llama,sweep,timeline --tokens 200 --steps 256 --sweep r22 --timed 240 --rounds 6 --params '{"attn_sync": "tagged"}' > "$R/gluon_check_r22.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r22.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_r22.log" | grep -v "^timeline" | tail -31 | cut -c1-300
  for m in qwen3-0.6b:128 llama-3.2-1b:4096; do
    IFS=: read -r model ctx <<< "$m"
    log "r22 $model $ctx"
    timeout 90 python3 benchmarks/gluon_check.py --model "$model" --context "$ctx" --out "$R/gluon_check_r22_$model-$ctx.json" --sections sweep --sweep r22 --timed 160 --rounds 4 > "$R/gluon_check_r22_$model-$ctx.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r22_$model-$ctx.log"
    grep -E "ms_p50|rc=" "$R/gluon_check_r22_$model-$ctx.log" | sed -E 's/"registers.*"ms_p50": ([0-9.]+).*"round_medians_ms": \[([^]]*)\].*/p50 \1 rounds \2/' | cut -c1-250
  done
  log gpu-tests
  timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -6 "$R/pytest_gpu.log"
  ;;
final)
  log decode-latency-1b
  timeout 160 $DL --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel --out "$R/decode_latency_1b.json" --max-seconds 145 > "$R/decode_latency_1b.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_1b.log"
  tail -8 "$R/decode_latency_1b.log"
  log decode-latency-qwen
  timeout 200 $DL --models qwen2.5-0.5b,qwen3-0.6b,qwen3-1.7b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_qwen.json" --max-seconds 185 > "$R/decode_latency_qwen.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_qwen.log"
  tail -12 "$R/decode_latency_qwen.log"
  ;;
waits)
  for m in llama-3.2-1b:50 qwen3-0.6b:50 qwen2.5-0.5b:50 qwen3-1.7b:50 llama-3.2-3b:55 llama-3.1-8b:65; do
    IFS=: read -r model limit <<< "$m"
    log "timeline $model"
    timeout "$limit" python3 benchmarks/gluon_check.py --model "$model" --out "$R/timeline_$model.json" --sections timeline > "$R/timeline_$model.log" 2>&1; echo "rc=$?" >> "$R/timeline_$model.log"
    python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['timeline']; print({k: round(v['wait_ratio'], 3) for k, v in t.items() if isinstance(v, dict)})" "$R/timeline_$model.json" 2>&1 | tail -1
  done
  rm -f "$R"/*_frame.csv.gz
  ;;
attn)
  for m in llama-3.2-1b qwen3-0.6b qwen2.5-0.5b; do
    log "attention stamps $m"
    timeout 50 python3 benchmarks/gluon_check.py --model "$m" --out "$R/attn_timeline_$m.json" --sections timeline > "$R/attn_timeline_$m.log" 2>&1; echo "rc=$?" >> "$R/attn_timeline_$m.log"
    python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['timeline']; [print(k, v['span_us'], json.dumps(v['attn_phases'])) for k, v in t.items() if isinstance(v, dict)]" "$R/attn_timeline_$m.json" 2>&1 | tail -2 | cut -c1-400
  done
  ;;
tests)
  log gpu-tests
  timeout 300 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -6 "$R/pytest_gpu.log"
  ;;
presets)
  log decode-latency-llama
  timeout 200 $DL --models llama-3.2-3b,llama-3.1-8b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" --out "$R/decode_latency_llama.json" --max-seconds 185 > "$R/decode_latency_llama.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_llama.log"
  tail -10 "$R/decode_latency_llama.log"
  ;;
esac
rm -f "$R"/*noprefetch_frame.csv.gz
find "$R" -type f | head -60
(cd "$R/.." && tar czf run.tgz run)
