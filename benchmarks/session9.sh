#!/usr/bin/env bash
# Prepared in session 8 for the ninth session's device calls (from the repository root, through the device tool;
# carry .carry .whl; everything lands under $OUT/run and run.tgz). Each call fits the device's 600 s:
#   bash benchmarks/session9.sh next    # sweep r24 (attn_min_chunk 64 / 128 / 256 / 512 against 32, with mma the
#                                       # default: a kv head's whole context in one task skips the partials, the
#                                       # ticket and the combine) on the 1B, Qwen2.5-0.5B, Qwen3-0.6B and 8B at
#                                       # context 128; r24long (kv_splits 32, 64-position blocks) on the 1B and 8B
#                                       # at 4096
#   bash benchmarks/session9.sh early   # round 25 (attn_operands=early: the tensor-core attention's operands
#                                       # converted before the dependency wait, q loaded straight into the A
#                                       # operand): checked on the 1B, Qwen2.5-0.5B and Qwen3-0.6B (argmax, logit
#                                       # error, timeline), the mma GPU tests (late and early), sweep r25 on the 1B
#                                       # (128, 4096), Qwen2.5-0.5B, Qwen3-0.6B and 8B
#   bash benchmarks/session9.sh whole   # round 26: one split for the whole context up to 512 positions with
#                                       # 128-position blocks, early operands (no partials, ticket or combine on
#                                       # the chain) on the 1B (128, 4096) and Qwen2.5-0.5B; the sanitizers
#   bash benchmarks/session9.sh chunk   # round 27: 256-position splits with 128-position blocks against the
#                                       # default on Qwen2.5-0.5B (128, 4096) and the 1B (128)
#   bash benchmarks/session9.sh wide    # after r27 (Qwen2.5's new auto blocks and splits): its check, its
#                                       # decode-latency set, every GPU test
#   bash benchmarks/session9.sh final   # issue 10's decode-latency set on the 1B (and 4096), the Qwen presets;
#                                       # the 1B's timeline (wait ratio)
#   bash benchmarks/session9.sh presets # Llama-3.2-3B and 3.1-8B (2 runs), their timelines; every GPU test
#   bash benchmarks/session9.sh tests   # every GPU test
#   bash benchmarks/session9.sh sanitize # compute-sanitizer memcheck and racecheck of the Gluon kernel (tiny Llama
#                                       # fp32 / bf16 with the tensor-core attention, tiny Qwen3 with q/k-norm): last
#                                       # run in session 3, before the attention layouts, gates and mma
. benchmarks/device_prelude.sh
case "${1:-}" in
next)
  sweep r24 llama-3.2-1b 128 80
  sweep r24 qwen2.5-0.5b 128 80
  sweep r24 qwen3-0.6b 128 80
  sweep r24 llama-3.1-8b 128 120
  sweep r24long llama-3.2-1b 4096 80
  sweep r24long llama-3.1-8b 4096 120
  ;;
early)
  gluon_check_params llama-3.2-1b early '{"attn_operands": "early"}'
  gluon_check_params qwen3-0.6b early '{"attn_operands": "early"}'
  gluon_check_params qwen2.5-0.5b early '{"attn_operands": "early"}'
  log gpu-tests-mma
  timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -k mma -p no:cacheprovider > "$R/pytest_gpu_mma.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu_mma.log"
  tail -4 "$R/pytest_gpu_mma.log"
  sweep r25 llama-3.2-1b 128 60
  sweep r25 qwen2.5-0.5b 128 60
  sweep r25 qwen3-0.6b 128 60
  sweep r25 llama-3.1-8b 128 100
  sweep r25 llama-3.2-1b 4096 60
  ;;
whole)
  sweep r26 llama-3.2-1b 128 70
  sweep r26 qwen2.5-0.5b 128 70
  sweep r26 llama-3.2-1b 4096 70
  sanitize
  ;;
chunk)
  sweep r27 qwen2.5-0.5b 128 60
  sweep r27 qwen2.5-0.5b 4096 60
  sweep r27 llama-3.2-1b 128 60
  ;;
wide)
  gluon_check_params qwen2.5-0.5b wide '{}'
  latency qwen25 130 --models qwen2.5-0.5b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts ""
  gpu_tests
  ;;
final)
  issue_sets 1b
  issue_sets qwen
  waits llama-3.2-1b 50
  ;;
presets)
  llama_presets
  gpu_tests
  ;;
tests) gpu_tests ;;
sanitize) sanitize ;;
*) echo "session9.sh: unknown stage '${1:-}' (next, early, whole, chunk, wide, final, presets, tests, sanitize)" >&2; exit 2 ;;
esac
finish
