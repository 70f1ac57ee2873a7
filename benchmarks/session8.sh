#!/usr/bin/env bash
# The eighth session's device calls (from the repository root, through the device tool; carry .carry .whl;
# everything lands under $OUT/run and run.tgz). Split in two so that each call fits the device's 600 s:
#   bash benchmarks/session8.sh next    # attn_layout=mma (the attention on the tensor cores; compiled for sm_90 in
#                                       # CI, never run before): Llama-1B, Qwen2.5-0.5B and Qwen3-0.6B argmax / logit
#                                       # error against the bf16 reference and fp32 (llama section); timeline stamps
#                                       # with it; sweep r23 (mma against the default) on the 1B at 128 and 4096
#   bash benchmarks/session8.sh next2   # sweep r23 on Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.1-8B; every GPU test
#                                       # (new: mma over several K/V blocks, with and without q/k-norm)
#   bash benchmarks/session8.sh final   # with mma the default: issue 10's decode-latency set on the 1B (and 4096
#                                       # context), the Qwen presets (2 runs); Qwen3-1.7B's timeline (wait ratio)
#   bash benchmarks/session8.sh presets # Llama-3.2-3B and 3.1-8B (2 runs), their timelines; every GPU test
#   bash benchmarks/session8.sh tests   # every GPU test
. benchmarks/device_prelude.sh
mma_check() {  # model
  log "mma check $1"
  timeout 120 python3 benchmarks/gluon_check.py --model "$1" --out "$R/gluon_check_mma_$1.json" --sections llama,timeline --steps 256 --params '{"attn_layout": "mma"}' > "$R/gluon_check_mma_$1.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_mma_$1.log"
  grep -vE "^\s+megakernel-noprefetch " "$R/gluon_check_mma_$1.log" | grep -E "^llama|attention phases|rc=|Error" | cut -c1-420
}
sweep() {  # model context limit_s
  log "r23 $1 $2"
  timeout "$3" python3 benchmarks/gluon_check.py --model "$1" --context "$2" --out "$R/gluon_check_r23_$1-$2.json" --sections sweep --sweep r23 --timed 160 --rounds 4 > "$R/gluon_check_r23_$1-$2.log" 2>&1; echo "rc=$?" >> "$R/gluon_check_r23_$1-$2.log"
  grep -E "ms_p50|rc=" "$R/gluon_check_r23_$1-$2.log" | sed -E 's/"registers.*"ms_p50": ([0-9.]+).*"round_medians_ms": \[([^]]*)\].*/p50 \1 rounds \2/' | cut -c1-250
}
DL="python3 benchmarks/decode_latency.py"
latency() {  # name limit_s args...
  local name=$1 limit=$2; shift 2
  log "decode-latency $name"
  timeout "$limit" $DL "$@" --out "$R/decode_latency_$name.json" --max-seconds $((limit - 15)) > "$R/decode_latency_$name.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_$name.log"
  tail -10 "$R/decode_latency_$name.log"
}
waits() {  # model limit_s: one step's timeline at context 128 (wait ratio, edges, phases)
  log "timeline $1"
  timeout "$2" python3 benchmarks/gluon_check.py --model "$1" --out "$R/timeline_$1.json" --sections timeline > "$R/timeline_$1.log" 2>&1; echo "rc=$?" >> "$R/timeline_$1.log"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['timeline']; print({k: round(v['wait_ratio'], 3) for k, v in t.items() if isinstance(v, dict)})" "$R/timeline_$1.json" 2>&1 | tail -1
}
gpu_tests() {
  log gpu-tests
  timeout 300 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -6 "$R/pytest_gpu.log"
}
case "${1:-}" in
next)
  for m in llama-3.2-1b qwen2.5-0.5b qwen3-0.6b; do mma_check "$m"; done
  sweep llama-3.2-1b 128 80
  sweep llama-3.2-1b 4096 80
  ;;
next2)
  sweep qwen2.5-0.5b 128 70
  sweep qwen3-0.6b 128 70
  sweep llama-3.1-8b 128 120
  gpu_tests
  ;;
final)
  latency 1b 160 --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel
  latency qwen 200 --models qwen2.5-0.5b,qwen3-0.6b,qwen3-1.7b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts ""
  waits qwen3-1.7b 50
  ;;
presets)
  latency llama 200 --models llama-3.2-3b,llama-3.1-8b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts ""
  waits llama-3.2-3b 55
  waits llama-3.1-8b 65
  gpu_tests
  ;;
tests) gpu_tests ;;
esac
rm -f "$R"/*_frame.csv.gz
find "$R" -type f | head -60
(cd "$R/.." && tar czf run.tgz run)
