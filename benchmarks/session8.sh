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
case "${1:-}" in
next)
  for m in llama-3.2-1b qwen2.5-0.5b qwen3-0.6b; do gluon_check_params "$m" mma '{"attn_layout": "mma"}'; done
  sweep r23 llama-3.2-1b 128 80
  sweep r23 llama-3.2-1b 4096 80
  ;;
next2)
  sweep r23 qwen2.5-0.5b 128 70
  sweep r23 qwen3-0.6b 128 70
  sweep r23 llama-3.1-8b 128 120
  gpu_tests
  ;;
final)
  issue_sets 1b
  issue_sets qwen
  waits qwen3-1.7b 50
  ;;
presets)
  llama_presets
  gpu_tests
  ;;
tests) gpu_tests ;;
*) echo "session8.sh: unknown stage '${1:-}' (next, next2, final, presets, tests)" >&2; exit 2 ;;
esac
finish
