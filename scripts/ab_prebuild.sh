#!/usr/bin/env bash
# Builds scripts/gpu_ab.sh's two binaries here (sm_90a only), so that the device call spends its minutes measuring,
# not compiling: this tree into build/device, this tree without .ab.patch (a git worktree in build/ab_ref) into
# its own build/device, both packed with the stamp of their sources into .ab_bins.tar.xz (git-ignored; carry it with
# .ab.patch). gpu_ab.sh uses the pack only while its stamp matches the tree and the patch it runs on, and builds
# otherwise. The binaries need only the CUDA libraries and the C/C++ runtimes, which the GPU machine has.
#   bash scripts/ab_prebuild.sh [bench ...]      # default nmkit_bench; nmkit_gpu_tests is always built
#   bash scripts/ab_prebuild.sh --stamp          # the stamp alone (what gpu_ab.sh compares)
set -euo pipefail
cd "$(dirname "$0")/.."
# The inputs of the binaries: the patch and the sources they are built from (not results, scripts or notes, which
# change between the build and the call without changing a binary).
stamp() {
  { cat .ab.patch; find CMakeLists.txt include src bench tests tools -type f \( -name CMakeLists.txt -o -name '*.cmake' \
      -o -name '*.[ch]pp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.in' -o -name '*.inc' \) -print0 |
      LC_ALL=C sort -z | xargs -0 sha1sum; } | sha1sum | cut -d" " -f1
}
if [ "${1:-}" = "--stamp" ]; then stamp; exit 0; fi
[ -s .ab.patch ] || { echo "ab_prebuild: no .ab.patch (git diff REF -- src include > .ab.patch)" >&2; exit 2; }
benches=("${@:-nmkit_bench}")
# The reference is this tree (committed or not) with the patch taken out, in a worktree kept under build/ so that
# a later call rebuilds only what changed.
ref=build/ab_ref
[ -d "$ref/.git" ] || [ -f "$ref/.git" ] || { rm -rf "$ref"; git worktree add -q --detach "$ref" HEAD; }
git -C "$ref" reset -q --hard && git -C "$ref" checkout -q --detach "$(git rev-parse HEAD)"
git diff HEAD | git -C "$ref" apply --allow-empty
(cd "$ref" && patch -p1 -R -s <"$OLDPWD/.ab.patch")
build() {  # source dir, targets...
  local src=$1; shift
  cmake -S "$src" -B "$src/build/device" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DNMKIT_BUILD_PYTHON=OFF -DNMKIT_DEFAULT_MODEL=/model-not-carried >/dev/null
  cmake --build "$src/build/device" -j "$(nproc)" --target "$@"
}
build . "${benches[@]}" nmkit_gpu_tests
build "$ref" "${benches[@]}"
pack=$(mktemp -d /tmp/nmkit_ab_pack.XXXXXX)
trap 'rm -rf "$pack"' EXIT
mkdir -p "$pack/this/bench" "$pack/this/tests" "$pack/ref/bench"
for b in "${benches[@]}"; do
  cp "build/device/bench/$b" "$pack/this/bench/"
  cp "$ref/build/device/bench/$b" "$pack/ref/bench/"
done
cp build/device/tests/nmkit_gpu_tests "$pack/this/tests/"
stamp >"$pack/stamp"
tar -cf - -C "$pack" . | xz -T0 -6 >.ab_bins.tar.xz.part && mv .ab_bins.tar.xz.part .ab_bins.tar.xz
echo "ab_prebuild: .ab_bins.tar.xz ($(du -h .ab_bins.tar.xz | cut -f1)); carry it with .ab.patch"
