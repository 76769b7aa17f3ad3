#!/usr/bin/env bash
# Kernel experiments against the default plan, each measured in the same interleaved rounds of one process
# (nmkit_bench --variant; docs/gpu.md). Run from the repository root on the H200 (device tool):
#   bash scripts/gpu_experiment.sh KEY=VALUE[,KEY=VALUE...] [another variant ...]
# e.g. schedule=staged or raster_rows=8,block_n=192 (the plan options the bench's --variant takes). For each
# variant: the llm suite twice with the variant beside the default plan; the bench checks the variant's product
# against cuBLAS's and fails the run where it is wrong; one line per row gives the variant's time over the
# default's (below 1: the variant is faster). The build is gpu_check.sh's (build/gpu, same configuration), so
# either script reuses the other's objects.
# Environment: NMKIT_EXPERIMENT_BENCH="<nmkit_bench arguments>" (default: the llm suite, both dtypes, 24 launches
# per library, without cuSPARSELt), NMKIT_EXPERIMENT_RUNS (default 2). Results go to $OUT (or ./gpu_out):
# <variant>.<run>.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_env.sh
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/gpu_experiment.sh KEY=VALUE[,KEY=VALUE...] [more variants...]" >&2
  exit 2
fi
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
BUILD=build/gpu
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" \
  -DNMKIT_DEFAULT_MODEL=/model-not-carried >/tmp/nmkit_configure.log 2>&1 || { tail -30 /tmp/nmkit_configure.log; exit 1; }
if ! cmake --build $BUILD -j "$(nproc)" --target nmkit_bench >/tmp/nmkit_build.log 2>&1; then
  grep -E "error" -A3 /tmp/nmkit_build.log | head -60
  exit 1
fi
echo "ptxas wgmma serialisation warnings (C7513-C7520): $(grep -c "wgmma.mma_async instructions are serialized" /tmp/nmkit_build.log || true)"
read -ra bench_args <<<"${NMKIT_EXPERIMENT_BENCH:---suite llm --dtype both --iters 24 --no-cusparselt}"

summary=()
for variant in "$@"; do
  name=${variant//[^A-Za-z0-9_.-]/_}
  echo; echo "=== $variant"
  ratios=""
  for run in $(seq 1 "${NMKIT_EXPERIMENT_RUNS:-2}"); do
    if ! timeout 600 $BUILD/bench/nmkit_bench "${bench_args[@]}" --variant "$variant" >"$OUT/$name.$run.txt" 2>&1; then
      summary+=("$variant: run $run FAILED (a wrong product or a refused option): $(tail -1 "$OUT/$name.$run.txt")")
      continue 2
    fi
    grep -E "^[a-z]+ +[0-9]+x|variant \(" "$OUT/$name.$run.txt" | sed -E 's/, rel. error.*//' | cut -c1-110
    ratios+=" [$(grep -oE '[0-9.]+x nmkit' "$OUT/$name.$run.txt" | sed 's/x nmkit//' | tr '\n' ' ' | sed 's/ $//')]"
  done
  summary+=("$variant: time over the default's per row:$ratios")
done
echo; echo "=== summary"
printf '%s\n' "${summary[@]}"
