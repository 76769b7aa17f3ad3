#!/usr/bin/env bash
# Profiles one launch of the sm90 2:4 kernel with Nsight Compute on the GPU machine (device tool, nothing to
# carry). Usage: bash scripts/gpu_profile.sh [R,K,C] [f16|bf16]   (default 8192,8192,8192 f16)
# Leaves the clocks alone (--clock-control none), as the GPU machine's method asks.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-8192,8192,8192}
dtype=${2:-f16}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DNMKIT_BUILD_TESTS=OFF >/dev/null
cmake --build build/gpu -j "$(nproc)" --target nmkit_bench >/dev/null
ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:sm90_nm24 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  build/gpu/bench/nmkit_bench --suite none --shape "$shape" --dtype "$dtype" --iters 3 --warmup 1 --no-cusparselt
