#!/usr/bin/env bash
# A/B of the working tree against another version of the library, for changes that no environment knob can switch
# (a schedule made at upload, a kernel's code): the other version is built from this tree with a patch taken out,
# and each benchmark runs once per build, one process after the other, in the same call. Compare ratios measured
# inside each process (speed-up over cuBLAS, or over a --tile-compare / --variant plan in the same rounds):
# absolute times move between processes. Before the device call, here:
#   git diff REF -- src include > .ab.patch      # REF: the version to compare against (e.g. main)
# then on the H200 (device tool, with carry [".ab.patch", ".deps/re2"]: both git-ignored), from the repository root:
#   bash scripts/gpu_ab.sh "<nmkit_bench arguments>" ["<more arguments>" ...]
# Builds build/gpu (this tree) and build/gpu-ab (this tree without .ab.patch), runs NMKIT_AB_TESTS (a gtest filter,
# default none) on this tree's build, then each argument string with both benches, this tree first. The bench is
# NMKIT_AB_BENCH (default nmkit_bench; e.g. nmkit_attention_bench); an argument string that starts with "@<bench> "
# runs that bench instead (both are built), so one call can A/B a change that touches two kernels. Results go to
# $OUT (or ./gpu_out): the rows of each pair are printed side by side, then (nmkit_bench) each row's medians over
# the pairs (bench/ab_medians.py, also in ab_medians.txt). The runs' own files (<n>.this.txt, <n>.ref.txt, .json) are packed
# into ab_runs.tgz after every pair: the device tool returns only a few files.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_env.sh
if [ $# -eq 0 ] || [ ! -s .ab.patch ]; then
  echo "usage: git diff REF -- src include > .ab.patch; bash scripts/gpu_ab.sh \"<nmkit_bench arguments>\" ..." >&2
  exit 2
fi
OUT=${OUT:-$PWD/gpu_out}
BENCH=${NMKIT_AB_BENCH:-nmkit_bench}
# Every bench an argument string names with "@<bench> " is built too.
benches=("$BENCH")
for args in "$@"; do
  [[ "$args" =~ ^@([a-z_]+)\  ]] || continue
  named=${BASH_REMATCH[1]}
  [[ " ${benches[*]} " == *" $named "* ]] || benches+=("$named")
done
mkdir -p "$OUT"
RUNS=$(mktemp -d /tmp/nmkit_ab_runs.XXXXXX)  # the runs' files, packed into $OUT/ab_runs.tgz
export PATH=/usr/local/cuda/bin:$PATH
configure() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${NMKIT_CUDA_ARCHS:-90a;80}" \
    -DNMKIT_DEFAULT_MODEL=/model-not-carried >"/tmp/nmkit_configure_$(basename "$2").log" 2>&1 ||
    { tail -30 "/tmp/nmkit_configure_$(basename "$2").log"; exit 1; }
}
REF_SRC=/tmp/nmkit_ab_ref
# The reference tree is kept between calls on a warm machine while this tree and the patch are unchanged, so that
# its build is not redone: patching gives its files new times.
tree() { tar --exclude=./.git --exclude=./build --exclude=./gpu_out --sort=name "$@" -cf - .; }
stamp=$({ cat .ab.patch; tree --exclude=./.deps --mtime=@0 --owner=0 --group=0; } | sha1sum | cut -d' ' -f1)
if [ "$(cat "$REF_SRC/.ab_stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$REF_SRC" && mkdir -p "$REF_SRC"
  tree | tar -xf - -C "$REF_SRC"
  (cd "$REF_SRC" && patch -p1 -R -s <.ab.patch) || { echo "gpu_ab: .ab.patch does not come out of this tree" >&2; exit 1; }
  echo "$stamp" >"$REF_SRC/.ab_stamp"
else
  echo "gpu_ab: reusing the reference tree (and its build) of an earlier call"
fi
if [ -s .ab_bins.tar.xz ] && [ "$(tar -xJOf .ab_bins.tar.xz ./stamp 2>/dev/null)" = "$(bash scripts/ab_prebuild.sh --stamp)" ]; then
  # Built on the development machine for this tree and patch (scripts/ab_prebuild.sh): no build here.
  bins=$(mktemp -d /tmp/nmkit_ab_bins.XXXXXX)
  tar -xJf .ab_bins.tar.xz -C "$bins"
  mkdir -p build/gpu/bench build/gpu/tests build/gpu-ab/bench
  cp "$bins"/this/bench/* build/gpu/bench/ && cp "$bins"/this/tests/* build/gpu/tests/ && cp "$bins"/ref/bench/* build/gpu-ab/bench/
  echo "gpu_ab: binaries from .ab_bins.tar.xz"
else
  [ -s .ab_bins.tar.xz ] && echo "gpu_ab: .ab_bins.tar.xz was built for another tree or patch (stamp" \
    "$(tar -xJOf .ab_bins.tar.xz ./stamp 2>/dev/null), here $(bash scripts/ab_prebuild.sh --stamp)); building here"
  configure . build/gpu
  configure "$REF_SRC" build/gpu-ab
  # Both builds at once: half the cores each.
  jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
  cmake --build build/gpu -j "$jobs" --target "${benches[@]}" nmkit_gpu_tests >/tmp/nmkit_build.log 2>&1 &
  this_build=$!
  cmake --build build/gpu-ab -j "$jobs" --target "${benches[@]}" >/tmp/nmkit_build_ab.log 2>&1
  ref_rc=$?
  wait $this_build
  this_rc=$?
  [ $this_rc -eq 0 ] || { grep -E "error" -A3 /tmp/nmkit_build.log | head -40; exit 1; }
  [ $ref_rc -eq 0 ] || { grep -E "error" -A3 /tmp/nmkit_build_ab.log | head -40; exit 1; }
fi
if [ -n "${NMKIT_AB_TESTS:-}" ]; then
  timeout 300 build/gpu/tests/nmkit_gpu_tests --gtest_filter="$NMKIT_AB_TESTS" >"$OUT/tests.log" 2>&1
  echo "tests ($NMKIT_AB_TESTS): rc $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
fi
n=0
for args in "$@"; do
  n=$((n + 1))
  bench=$BENCH
  if [[ "$args" =~ ^@([a-z_]+)\ (.*)$ ]]; then bench=${BASH_REMATCH[1]}; args=${BASH_REMATCH[2]}; fi
  read -ra bench_args <<<"$args"
  this_json=() ref_json=()
  if [ "$bench" = nmkit_bench ]; then this_json=(--json "$RUNS/$n.this.json") ref_json=(--json "$RUNS/$n.ref.json"); fi
  timeout 300 "build/gpu/bench/$bench" "${bench_args[@]}" "${this_json[@]}" >"$RUNS/$n.this.txt" 2>&1
  timeout 300 "build/gpu-ab/bench/$bench" "${bench_args[@]}" "${ref_json[@]}" >"$RUNS/$n.ref.txt" 2>&1
  tar czf "$OUT/ab_runs.tgz" -C "$RUNS" .  # after every pair: a call cut by its limit keeps the pairs it ran
  echo; echo "=== $n: $bench $args (this tree, then the reference)"
  # Table rows: nmkit_bench's start with the suite name, nmkit_attention_bench's with the sequence length.
  rows='^([a-z0-9]+ +[0-9]+x|[0-9]+ +[0-9]+ +[01] )'
  paste -d '\n' <(grep -E "$rows" "$RUNS/$n.this.txt" | sed 's/^/this /') \
                <(grep -E "$rows" "$RUNS/$n.ref.txt" | sed 's/^/ref  /') | cut -c1-200
done
if ls "$RUNS"/*.this.json >/dev/null 2>&1; then
  echo; python3 bench/ab_medians.py "$RUNS" | tee "$OUT/ab_medians.txt"
fi
exit 0
