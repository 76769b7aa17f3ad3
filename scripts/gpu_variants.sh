#!/usr/bin/env bash
# Times several versions of a kernel in one device call, against this tree, in interleaved rounds. Each version is
# a directory of whole replacement files at their repository paths (e.g. V/src/cuda/attention/sm90_dfss_kernel.cuh);
# one build tree is made for this tree, then each version's files are copied in, only what they touch is rebuilt
# (a header used by one kernel: that kernel's translation unit) and its bench binary is kept. The benches run
# round-robin (this tree first), so the versions share the GPU's state; compare each row's ratio (e.g. 2:4 / dense)
# and TF/s across versions within a round, and across rounds for the spread. On the GPU machine (device tool, with
# carry [".deps/re2"]; the version directories travel as untracked files, or name them in carry):
#   bash scripts/gpu_variants.sh BENCH "<bench arguments>" VERSION_DIR...
# e.g. bash scripts/gpu_variants.sh nmkit_attention_bench "--seq 4096 --head-dim 128 --causal 0 --iters 10
#      --unfused 0" variants/*/
# NMKIT_ROUNDS (default 2) rounds. A version that changes a header many kernels include rebuilds them all (~1 min).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_env.sh
if [ $# -lt 3 ]; then
  echo "usage: bash scripts/gpu_variants.sh BENCH \"<bench arguments>\" VERSION_DIR..." >&2
  exit 2
fi
bench=$1 args=$2
shift 2
export PATH=/usr/local/cuda/bin:$PATH
# A build tree of its own: between calls it holds the last version's objects, and the device's copy of this tree
# keeps this machine's (older) file times, so ninja would not rebuild them for this tree. Touching every file a
# version replaces makes the first build this tree's.
build_dir=build/gpu-variants
for dir in "$@"; do
  (cd "$dir" && find . -type f -print0) | xargs -0 -r touch -c --
done
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${NMKIT_CUDA_ARCHS:-90a}" \
  -DNMKIT_DEFAULT_MODEL=/model-not-carried >/tmp/nmkit_configure.log 2>&1 || { tail -30 /tmp/nmkit_configure.log; exit 1; }
bins=$(mktemp -d /tmp/nmkit_variants.XXXXXX)
saved=$(mktemp -d /tmp/nmkit_variants_saved.XXXXXX)  # this tree's copies of the files the versions replace
build() {  # $1: the name to keep the binary under
  local start=$SECONDS
  cmake --build "$build_dir" -j "$(nproc)" --target "$bench" >/tmp/nmkit_build.log 2>&1 ||
    { grep -E "error" -A3 /tmp/nmkit_build.log | head -40; return 1; }
  cp "$build_dir/bench/$bench" "$bins/$1"
  echo "built $1 in $((SECONDS - start)) s"
}
restore() { (cd "$saved" && find . -type f -print0 | xargs -0 -r -I{} cp {} "$OLDPWD/{}"); }
trap restore EXIT
build this || exit 1
names=(this)
for dir in "$@"; do
  dir=${dir%/} name=$(basename "$dir")
  while IFS= read -r -d '' file; do
    path=${file#"$dir"/}
    [ -f "$path" ] || { echo "gpu_variants: $dir replaces $path, which this tree does not have" >&2; exit 1; }
    [ -f "$saved/$path" ] || { mkdir -p "$saved/$(dirname "$path")" && cp "$path" "$saved/$path"; }
    cp "$file" "$path"
  done < <(find "$dir" -type f -print0)
  build "$name" && names+=("$name")
  restore
done
read -ra bench_args <<<"$args"
for round in $(seq "${NMKIT_ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    timeout 300 "$bins/$name" "${bench_args[@]}" 2>&1 | grep -E '^ *[0-9]' | sed "s/^/r$round $name /"
  done
done
