#!/usr/bin/env bash
# Profiles one launch of a Hopper kernel with Nsight Compute on the GPU machine (device tool, carrying .deps/re2: scripts/carry_re2.sh):
#   bash scripts/gpu_profile.sh [nm24] [R,K,C] [f16|bf16]           the 2:4 kernel (default 8192,8192,8192 f16)
#   bash scripts/gpu_profile.sh tile [R,K,C] [density] [tile side]  the tile kernel (default 4096^3, 0.05, 64)
#   bash scripts/gpu_profile.sh attention [S] [head dim]           the fused attention kernel, 2:4 and its dense
#                                                                   mode, bf16 non-causal (default 4096, 128)
# Prints speed of light, memory and warp-state sections, and for the tile kernel the stall reasons per issued
# instruction; for attention, each mode's scheduler and warp-state sections and its per-instruction source page
# ($OUT/attention_{sparse,dense}_source.csv.gz: stall samples by SASS line, which scripts/ncu_source.py
# summarises). Leaves the clocks alone (--clock-control none), as the GPU machine's method asks.
# NMKIT_PROFILE_REPORT=1 also saves the full report with source-level sampling (the build has -lineinfo) to
# $OUT/nm24.ncu-rep or $OUT/tile.ncu-rep, and its per-instruction source page as $OUT/nm24_source.csv or
# $OUT/tile_source.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
family=nm24
if [ "${1:-}" = "nm24" ] || [ "${1:-}" = "tile" ] || [ "${1:-}" = "attention" ]; then family=$1; shift; fi
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DNMKIT_BUILD_TESTS=OFF >/dev/null
cmake --build build/gpu -j "$(nproc)" --target nmkit_bench nmkit_attention_bench >/dev/null
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats)

# NMKIT_PROFILE_REPORT=1: also the full report with source-level sampling and its per-instruction source page.
save_report() {  # $1: report name, $2: kernel regex, $3: launches to skip, then the bench arguments
  local name=$1 kernel=$2 skip=$3 out=${OUT:-$PWD/gpu_out}
  shift 3
  mkdir -p "$out"
  ncu --clock-control none --launch-skip "$skip" --launch-count 1 -k "regex:$kernel" --set full --import-source yes \
    -o "$out/$name" -f build/gpu/bench/nmkit_bench "$@" >/dev/null
  ncu --import "$out/$name.ncu-rep" --page source --print-source sass --csv >"$out/${name}_source.csv" ||
    echo "this ncu cannot print the source page; open $out/$name.ncu-rep in Nsight Compute"
}

if [ "$family" = "attention" ]; then
  out=${OUT:-$PWD/gpu_out}
  mkdir -p "$out"
  bench_args=(--seq "${1:-4096}" --head-dim "${2:-128}" --causal 0 --iters 2 --unfused 0)
  for mode in sparse dense; do
    # The kernel's mangled name ends its template arguments with the mode: Lb1E (2:4) or Lb0E (dense).
    kernel="sm90_dfss_kernel.*Li${2:-128}ELb$([ $mode = sparse ] && echo 1 || echo 0)E"
    ncu --clock-control none --kernel-name-base mangled -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis \
      build/gpu/bench/nmkit_attention_bench "${bench_args[@]}" | grep -vE '^(==PROF==|S |[0-9])'
    ncu --clock-control none --kernel-name-base mangled -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
      --set full --import-source yes -o "/tmp/attention_$mode" -f build/gpu/bench/nmkit_attention_bench \
      "${bench_args[@]}" >/dev/null
    ncu --import "/tmp/attention_$mode.ncu-rep" --page source --print-source sass --csv |
      gzip >"$out/attention_${mode}_source.csv.gz"
  done
  exit 0
fi

if [ "$family" = "nm24" ]; then
  shape=${1:-8192,8192,8192}
  dtype=${2:-f16}
  bench_args=(--suite none --shape "$shape" --dtype "$dtype" --iters 3 --warmup 1 --no-cusparselt)
  ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:sm90_sparse_kernel "${sections[@]}" \
    --section ComputeWorkloadAnalysis build/gpu/bench/nmkit_bench "${bench_args[@]}"
  if [ -n "${NMKIT_PROFILE_REPORT:-}" ]; then save_report nm24 sm90_sparse_kernel 3 "${bench_args[@]}"; fi
  exit 0
fi

shape=${1:-4096,4096,4096}
density=${2:-0.05}
side=${3:-64}
stalls=""
for reason in wait long_scoreboard barrier membar sleeping lg_throttle math_pipe_throttle short_scoreboard \
              mio_throttle dispatch_stall misc no_instruction branch_resolving drain selected not_selected; do
  stalls+="smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio,"
done
ncu --clock-control none --launch-skip 4 --launch-count 1 -k regex:sm90_tile "${sections[@]}" \
  --metrics "${stalls}dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct" \
  build/gpu/bench/nmkit_bench --suite tile --dtype f16 --shape "$shape" --tile-sides "$side" \
  --tile-densities "$density" --iters 2 --warmup 1
if [ -n "${NMKIT_PROFILE_REPORT:-}" ]; then
  save_report tile sm90_tile 4 --suite tile --dtype f16 --shape "$shape" --tile-sides "$side" \
    --tile-densities "$density" --iters 2 --warmup 1
fi
