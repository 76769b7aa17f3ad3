#!/usr/bin/env bash
# Builds nmkit_bench here (sm_90a, with its cuSPARSELt baseline) and packs it, so that a device call spends its
# minutes measuring, not compiling: the models suite takes ~1.4 s a row (264 rows a dtype, one call), and a build
# there takes several minutes of a call. cuSPARSELt comes from PyPI (nvidia-cusparselt-cu13, the version the GPU
# machine's PyTorch ships) into .deps/cusparselt; the binary links it by soname and finds the GPU machine's copy at
# run time.
#   bash scripts/bench_prebuild.sh               # here: build into build/device, pack into .bench_bin.tar.xz
#   bash scripts/bench_prebuild.sh --run ARGS... # on the GPU machine (carry .bench_bin.tar.xz): nmkit_bench ARGS
# e.g. the models suite (--resume continues a run that a call's limit cut):
#   bash scripts/bench_prebuild.sh --run --suite models --dtype f16 --iters 5 \
#     --resume bench/results/h200/models_f16_run1.json
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.bench_bin.tar.xz

if [ "${1:-}" = "--run" ]; then
  shift
  [ -s "$pack" ] || { echo "bench_prebuild: no $pack (build it on the development machine, carry it)" >&2; exit 2; }
  dir=$(mktemp -d /tmp/nmkit_bench.XXXXXX)
  tar -xJf "$pack" -C "$dir"
  echo "bench_prebuild: nmkit_bench of $(cat "$dir/stamp")"
  lib=$(find /opt /usr .deps -name libcusparseLt.so.0 -print -quit 2>/dev/null || true)
  [ -n "$lib" ] || { echo "bench_prebuild: no libcusparseLt.so.0 on this machine" >&2; exit 2; }
  export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec "$dir/nmkit_bench" "$@"
fi

cusparselt_version=0.8.0  # bench/results/h200/README.md: the GPU machine's cuSPARSELt
root=.deps/cusparselt
if [ ! -f "$root/nvidia/cusparselt/lib/libcusparseLt.so.0" ]; then
  echo "bench_prebuild: installing nvidia-cusparselt-cu13==$cusparselt_version into $root"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$root" \
    "nvidia-cusparselt-cu13==$cusparselt_version"
fi
# The cached search results are dropped so that a tree configured without the baseline finds it now.
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DNMKIT_BUILD_PYTHON=OFF -DNMKIT_DEFAULT_MODEL=/model-not-carried \
  -DNMKIT_CUSPARSELT_ROOT="$PWD/$root/nvidia/cusparselt" -U NMKIT_CUSPARSELT_INCLUDE -U NMKIT_CUSPARSELT_LIBRARY \
  >/dev/null
cmake --build build/device -j "$(nproc)" --target nmkit_bench
ldd build/device/bench/nmkit_bench | grep -q libcusparseLt ||
  { echo "bench_prebuild: nmkit_bench was built without cuSPARSELt" >&2; exit 1; }
staging=$(mktemp -d /tmp/nmkit_bench_pack.XXXXXX)
trap 'rm -rf "$staging"' EXIT
cp build/device/bench/nmkit_bench "$staging/"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include bench || echo ' with uncommitted changes')" \
  >"$staging/stamp"
tar -cf - -C "$staging" . | xz -T0 -6 >"$pack.part" && mv "$pack.part" "$pack"
echo "bench_prebuild: $pack ($(du -h "$pack" | cut -f1), $(cat "$staging/stamp")); carry it to the GPU machine"
