#!/usr/bin/env bash
# Prepared in session 10 for the eleventh session's device calls (from the repository root, through the device
# tool; carry .carry .whl; pass BUBBLESCOPE_COMMIT; everything lands under $OUT/run and run.tgz):
#   bash benchmarks/session11.sh next    # round 32 (attn_new_row=row: the first K/V block's older rows before the
#                                        # dependency wait; attn_combine=lanes: the split combine's reductions in
#                                        # one warp's lanes), both compiled for sm_90 but never run: the mma GPU
#                                        # tests (12 cases with late-row), their check on the 1B (timeline frames
#                                        # kept: chain_breakdown.py), Qwen3-0.6B and Qwen2.5-0.5B, sweep r32
# Then `session9.sh presets` and `issue_sets qwen`: the larger Llamas and the Qwen presets were last recorded in
# session 8, before mv_ahead=1 became the default.
. benchmarks/device_prelude.sh
case "${1:-}" in
next)
  log gpu-tests-mma
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -k mma -p no:cacheprovider > "$R/pytest_gpu_mma.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu_mma.log"
  tail -4 "$R/pytest_gpu_mma.log"
  P='{"attn_new_row": "row", "attn_combine": "lanes"}'
  gluon_check_params llama-3.2-1b rowlanes "$P"
  keep_frames gluon_check_rowlanes
  gluon_check_params qwen3-0.6b rowlanes "$P"
  gluon_check_params qwen2.5-0.5b rowlanes "$P"
  sweep_set r32
  ;;
*) echo "session11.sh: unknown stage '${1:-}' (next)" >&2; exit 2 ;;
esac
finish
