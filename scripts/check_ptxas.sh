#!/usr/bin/env bash
# Compiles the Hopper kernels' translation units for sm_90a alone and fails if ptxas serialised any kernel's
# wgmma (infos C7513-C7520, "wgmma.mma_async instructions are serialized ...": a wait after every wgmma, which
# it reports without failing the build, and which leaves no two wgmma in flight; docs/notes/tile.md tells how it
# was found). Run by ctest (ptxas.no_serialised_wgmma); needs only nvcc, no GPU.
#   scripts/check_ptxas.sh <nvcc> <repository root>
set -euo pipefail
nvcc=$1
root=$2
status=0
for unit in "$root"/src/cuda/*/sm90_*.cu; do
  log=$("$nvcc" -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -DNMKIT_HAVE_SM90A=1 -I"$root/include" \
        --generate-code=arch=compute_90a,code=sm_90a -c "$unit" -o /dev/null 2>&1) || { echo "$log"; exit 1; }
  serialised=$(grep -c "wgmma.mma_async instructions are serialized" <<<"$log" || true)
  echo "${unit#$root/}: kernels with serialised wgmma: $serialised"
  if [ "$serialised" -ne 0 ]; then
    grep "wgmma.mma_async instructions are serialized" <<<"$log" | head -5
    status=1
  fi
done
exit $status
