# Sourced by benchmarks/session*.sh on the device machine (repository root): installs the carried msgspec wheel,
# sets the environment, makes $R (= $OUT/run), writes env.txt (GPU, clocks, versions, BUBBLESCOPE_COMMIT) and defines
# the stages (below) that the session scripts call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=${OUT:-/tmp/bubblescope-session}/run
mkdir -p "$R"
log() { echo "=== $* $(date +%T)"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__,'gpus',torch.cuda.device_count())"
  echo "commit ${BUBBLESCOPE_COMMIT:-unknown}"; } > "$R/env.txt" 2>&1
cat "$R/env.txt"

# The stages the session scripts are made of; each writes $R/<name>.{json,log} and prints its summary lines.
gluon_check_params() {  # model tag params_json: correctness against the bf16 reference and fp32 (llama section)
  # and one step's timeline, with the params named
  log "check $2 $1"
  local f="$R/gluon_check_$2_$1"
  timeout 120 python3 benchmarks/gluon_check.py --model "$1" --out "$f.json" --sections llama,timeline --steps 256 --params "$3" > "$f.log" 2>&1; echo "rc=$?" >> "$f.log"
  grep -vE "^\s+megakernel-noprefetch " "$f.log" | grep -E "^llama|attention phases|rc=|Error" | cut -c1-420
}
sweep() {  # sweep model context limit_s: gluon_check.py's SWEEPS[sweep], interleaved rounds
  log "$1 $2 $3"
  local f="$R/gluon_check_$1_$2-$3"
  timeout "$4" python3 benchmarks/gluon_check.py --model "$2" --context "$3" --out "$f.json" --sections sweep --sweep "$1" --timed 160 --rounds 4 > "$f.log" 2>&1; echo "rc=$?" >> "$f.log"
  grep -E "ms_p50|rc=" "$f.log" | sed -E 's/\{"ms_p50": ([0-9.]+), "ms_p99": [0-9.]+, "round_medians_ms": \[([^]]*)\].*/p50 \1 rounds \2/' | cut -c1-250
}
DL="python3 benchmarks/decode_latency.py"
latency() {  # name limit_s decode_latency.py-args...
  local name=$1 limit=$2; shift 2
  log "decode-latency $name"
  timeout "$limit" $DL "$@" --out "$R/decode_latency_$name.json" --max-seconds $((limit - 15)) > "$R/decode_latency_$name.log" 2>&1; echo "rc=$?" >> "$R/decode_latency_$name.log"
  tail -10 "$R/decode_latency_$name.log"
}
issue_sets() {  # 1b | qwen | llama: issue 10's decode-latency set on the 1B (and 4096 context); the Qwen or the
  # larger Llama presets against compile and the Triton kernel (2 runs)
  case "$1" in
  1b) latency 1b 160 --engines reference-compile,megakernel-triton,megakernel-noprefetch,megakernel,megakernel@stepwise --long-context-engines megakernel ;;
  qwen) latency qwen 200 --models qwen2.5-0.5b,qwen3-0.6b,qwen3-1.7b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" ;;
  llama) latency llama 200 --models llama-3.2-3b,llama-3.1-8b --engines reference-compile,megakernel-triton,megakernel --runs 2 --long-contexts "" ;;
  *) echo "issue_sets: unknown set '$1' (1b, qwen, llama)" >&2; return 2 ;;
  esac
}
waits() {  # model limit_s: one step's timeline at context 128 (wait ratio, edges, phases)
  log "timeline $1"
  timeout "$2" python3 benchmarks/gluon_check.py --model "$1" --out "$R/timeline_$1.json" --sections timeline > "$R/timeline_$1.log" 2>&1; echo "rc=$?" >> "$R/timeline_$1.log"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['timeline']; print({k: round(v['wait_ratio'], 3) for k, v in t.items() if isinstance(v, dict)})" "$R/timeline_$1.json" 2>&1 | tail -1
}
llama_presets() {  # the larger Llama presets' decode-latency set (issue_sets llama) and their timelines
  issue_sets llama
  waits llama-3.2-3b 55
  waits llama-3.1-8b 65
}
keep_frames() {  # prefix: keep the per-task frames of $R/<prefix>_* (finish drops *_frame.csv.gz)
  for f in "$R"/"$1"_*_frame.csv.gz; do [ -e "$f" ] && mv "$f" "${f%_frame.csv.gz}_frames.csv.gz"; done
}
fp32_check() {  # tag params_json: stories260K's greedy tokens and the tiny fp32 models against the reference
  log "stories, tiny (fp32) $1"
  local f="$R/gluon_check_$1_fp32"
  timeout 120 python3 benchmarks/gluon_check.py --sections stories,tiny --params "$2" --out "$f.json" > "$f.log" 2>&1; echo "rc=$?" >> "$f.log"
  grep -E "^(stories|tiny)|rc=|Error" "$f.log" | cut -c1-500
}
sweep_set() {  # sweep: gluon_check.py's SWEEPS[sweep] on the 1B (128, 4096), Qwen3-0.6B, Qwen2.5-0.5B and the 8B
  sweep "$1" llama-3.2-1b 128 70
  sweep "$1" qwen3-0.6b 128 70
  sweep "$1" qwen2.5-0.5b 128 70
  sweep "$1" llama-3.2-1b 4096 80
  sweep "$1" llama-3.1-8b 128 120
}
gpu_tests() {  # every GPU test
  log gpu-tests
  timeout 300 python3 -m pytest -q -m gpu tests/test_gpu_megakernel.py -p no:cacheprovider > "$R/pytest_gpu.log" 2>&1; echo "rc=$?" >> "$R/pytest_gpu.log"
  tail -6 "$R/pytest_gpu.log"
}
sanitize() {  # compute-sanitizer memcheck and racecheck on a few decode steps of tiny models (Gluon kernel)
  for tool in memcheck racecheck; do
    log "sanitizer $tool"
    timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_megakernel.py gluon > "$R/sanitizer_$tool.log" 2>&1; echo "rc=$?" >> "$R/sanitizer_$tool.log"
    tail -8 "$R/sanitizer_$tool.log"
  done
}
finish() {  # drop the per-task frames, list and pack $R (the device tool returns few files; run.tgz has all)
  rm -f "$R"/*_frame.csv.gz
  find "$R" -type f | head -60
  (cd "$R/.." && tar czf run.tgz run)
}
