# Sourced by benchmarks/session*.sh on the device machine (repository root): installs the carried msgspec wheel,
# sets the environment, makes $R (= $OUT/run) and writes env.txt (GPU, clocks, versions, BUBBLESCOPE_COMMIT).
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
