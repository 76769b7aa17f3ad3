#!/usr/bin/env bash
# Profiling helper for the Hopper tile kernel (run on the GPU machine from the repository root): GPU tests of the
# tile family, the tile suite for square 64/128 tiles, then Nsight Compute on one configuration with the stall
# reasons that matter for a TMA/wgmma pipeline. Usage: bash scripts/dev/tile_profile.sh [R,K,C] [density]
set -uo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-4096,4096,4096}
density=${2:-0.05}
NMKIT_GPU_TESTS='TileGpu.*' NMKIT_GPU_TEST_TIMEOUT=150 NMKIT_BENCH_SKIP=1 NMKIT_BENCH_TIMEOUT=120 \
  NMKIT_BENCH_VNM="--suite tile --dtype f16 --tile-sides 64,128 --iters 10" \
  bash scripts/gpu_check.sh --quick 2>&1 | grep -E "^tile|gpu tests|FAILED|Failure" | grep -v skewed
stalls=""
for r in long_scoreboard barrier membar wait sleeping lg_throttle math_pipe_throttle short_scoreboard mio_throttle \
         dispatch_stall misc no_instruction branch_resolving drain selected not_selected; do
  stalls+="smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio,"
done
timeout 120 ncu --kernel-name regex:sm90_tile --launch-skip 4 --launch-count 1 --section SpeedOfLight \
  --metrics "${stalls}dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
  build/gpu/bench/nmkit_bench --suite tile --dtype f16 --tile-sides 64 --shape "$shape" --tile-densities "$density" \
  --iters 2 --warmup 1 2>&1 | grep -vE "^tile|^suite|^==PROF==|^$|^host" | tail -40
