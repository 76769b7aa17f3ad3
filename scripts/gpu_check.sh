#!/usr/bin/env bash
# The one GPU-machine job: build, GPU tests, compute-sanitizer, benchmarks, a short summary last.
# Run from the repository root on the H200 (device tool), carrying .deps/re2 (scripts/carry_re2.sh):
#   bash scripts/gpu_check.sh [--quick] [bench args...]
# --quick skips the sanitizers and runs the llm suite only. Results go to $OUT (or ./gpu_out), few files
# so that the device tool brings them all back: gpu_tests.log, sanitizer.log, bench.json, bench.txt,
# speedup.png (and vnm.json, vnm.txt, vnm_*.png). Build logs stay in build/gpu and are printed on failure.
# Environment: NMKIT_GPU_TESTS=<gtest filter> narrows the GPU tests; NMKIT_BENCH_VNM="<args>" also runs the
# V:N:M suite (e.g. "--suite vnm --dtype both"; any nmkit_bench arguments, "--suite tile" too); NMKIT_BENCH_SKIP=1
# skips the 2:4 benchmark; NMKIT_SANITIZE_TESTS / NMKIT_SANITIZE_TOOLS override the sanitizer's tests and tools,
# NMKIT_SANITIZE_TIMEOUT (seconds, default 600) bounds each tool's run, so that a call's benchmarks still run after it;
# NMKIT_GPU_TEST_TIMEOUT / NMKIT_BENCH_TIMEOUT (seconds) bound each GPU test suite and each extra benchmark run;
# NMKIT_CMAKE_ARGS adds CMake arguments to the configure step; NMKIT_BENCH_TORCH="<args>" (any, e.g. "--dtype f16") also runs bench/torch_linear.py (the PyTorch layers);
# NMKIT_BENCH_ATTENTION="<args>" (any, e.g. "--quick") also runs bench/torch_attention.py (SDPA against nmkit attention);
# NMKIT_ATTENTION_KERNEL="<args>" (e.g. "--seq 4096,16384") also runs nmkit_attention_bench (fused dense and 2:4, and the
# unfused pipeline);
# NMKIT_COPY_PROBE=1 also runs nmkit_copy_probe (copy_probe.txt); NMKIT_BENCH_REPEAT=N runs the 2:4 benchmark N
# times (bench2.json ...) and ends with the per-row medians of its ratios; several ';'-separated NMKIT_BENCH_VNM
# runs end with the medians over their JSON too.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
BUILD=build/gpu
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
bench_args=("$@")
repeats=${NMKIT_BENCH_REPEAT:-1}
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "NMKIT_BENCH_REPEAT must be a positive integer, got '$repeats'"; exit 1; }
[ ${#bench_args[@]} -eq 0 ] && bench_args=(--suite all)
[ $quick -eq 1 ] && [ $# -eq 0 ] && bench_args=(--suite llm)
summary=()

step() { echo; echo "=== $* ($(date +%T))"; }

step "configure and build"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" ${NMKIT_CMAKE_ARGS:-} \
  -DNMKIT_DEFAULT_MODEL=/model-not-carried >/tmp/nmkit_configure.log 2>&1 || { tail -30 /tmp/nmkit_configure.log; exit 1; }
grep -i "cusparselt" /tmp/nmkit_configure.log
# Keep going past a failed target (-k 0), so that a Python module that does not build (another nanobind, no
# headers) costs its own step, not the call; the C++ tests and benchmarks must build.
if ! cmake --build $BUILD -j "$(nproc)" -- -k 0 >/tmp/nmkit_build.log 2>&1; then
  grep -E "error" -A3 /tmp/nmkit_build.log | head -60
  [ -x $BUILD/tests/nmkit_gpu_tests ] && [ -x $BUILD/bench/nmkit_bench ] || exit 1
  summary+=("build: FAILED for some targets (the C++ tests and benchmark built)")
else
  summary+=("build: ok")
fi

step "SASS: the wgmma.sp kernel issues HGMMA"
for unit in nm24/sm90_nm24_spmm vnm/sm90_vnm_spmm; do
  cuobjdump --dump-sass $BUILD/CMakeFiles/nmkit.dir/src/cuda/$unit.cu.o 2>/dev/null >/tmp/nmkit_sm90.sass
  hgmma=$(grep -c "HGMMA" /tmp/nmkit_sm90.sass || true)
  echo "$unit: HGMMA instructions: $hgmma"
  summary+=("$unit SASS HGMMA count: $hgmma")
done

# ptxas serialises every wgmma of a kernel (a wait after each) when it cannot prove the accumulators idle where
# they are read; it says so only in an info line.
serialised=$(grep -c "wgmma.mma_async instructions are serialized" /tmp/nmkit_build.log || true)
echo "kernels whose wgmma ptxas serialised (C7513-C7520): $serialised"
summary+=("ptxas wgmma serialisation warnings (C7513-C7520): $serialised")

step "GPU tests"
# One process per test suite, each with a time limit: a kernel that hangs costs its suite and a few minutes of
# device time, not the whole call, and the suites after it still run.
: >"$OUT/gpu_tests.log"
tests_rc=0
# One gtest filter per suite: "Suite.a:Suite.b", the tests of that suite that NMKIT_GPU_TESTS selects.
suite_filters=$($BUILD/tests/nmkit_gpu_tests --gtest_list_tests --gtest_filter="${NMKIT_GPU_TESTS:-*}" |
  awk '/^[A-Za-z]/ { if (f) print f; suite = $1; f = "" } /^  / { f = f (f ? ":" : "") suite $1 } END { if (f) print f }')
for filter in $suite_filters; do
  timeout "${NMKIT_GPU_TEST_TIMEOUT:-150}" $BUILD/tests/nmkit_gpu_tests --gtest_filter="$filter" >>"$OUT/gpu_tests.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    tests_rc=$rc
    [ $rc -eq 124 ] && echo "[  FAILED  ] ${filter%%.*}: timed out after ${NMKIT_GPU_TEST_TIMEOUT:-150} s (a kernel hung?)" |
      tee -a "$OUT/gpu_tests.log"
  fi
done
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|Failure|error|rel" "$OUT/gpu_tests.log" | head -40
summary+=("gpu tests: $([ $tests_rc -eq 0 ] && echo passed || echo FAILED) ($(grep -c '^\[       OK' "$OUT/gpu_tests.log") ok)")

step "Python package (nmkit, nmkit.torch) against PyTorch on the GPU"
if compgen -G "$BUILD/python/nmkit/_nmkit*.so" >/dev/null; then
  PYTHONPATH=$BUILD/python NMKIT_CLI=$BUILD/tools/nmkit/nmkit timeout 600 python3 -m unittest discover -v -s python/tests \
    >"$OUT/python_tests.log" 2>&1
  py_rc=$?
  grep -E "^(Ran|OK|FAILED)|skipped|Error|FAIL:" "$OUT/python_tests.log" | head -20
  summary+=("python tests: $([ $py_rc -eq 0 ] && echo passed || echo FAILED) ($(grep -cE ' \.\.\. ok$' "$OUT/python_tests.log") ok, $(grep -c 'skipped' "$OUT/python_tests.log") skipped)")
else
  grep "nmkit Python package" /tmp/nmkit_configure.log
  summary+=("python tests: not built ($(grep -m1 'nmkit Python package' /tmp/nmkit_configure.log))")
fi

step "CPU unit tests (the real-model fixture is not carried)"
$BUILD/tests/nmkit_cpu_tests --gtest_filter='-*RealModel*:WordPiece.*:Bert.*' >/tmp/nmkit_cpu_tests.log 2>&1
summary+=("cpu tests: $([ $? -eq 0 ] && echo passed || echo FAILED)")

step "nmkit demo on a synthetic layer (the real model is not carried)"
python3 -c "
import numpy as np
from safetensors.numpy import save_file
w = np.random.default_rng(0).standard_normal((1536, 384)).astype(np.float32) * 0.05
save_file({'encoder.layer.0.intermediate.dense.weight': w}, '/tmp/nmkit_demo_layer.safetensors')"
$BUILD/tools/nmkit/nmkit demo --model /tmp/nmkit_demo_layer.safetensors --tokens 512 >/tmp/nmkit_demo.log 2>&1
demo_rc=$?
grep -A2 "on the GPU" /tmp/nmkit_demo.log
summary+=("nmkit demo (GPU 2:4 layer vs CPU oracle): $([ $demo_rc -eq 0 ] && echo ok || echo FAILED)")

if [ $quick -eq 0 ]; then
  for tool in ${NMKIT_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    step "compute-sanitizer $tool"
    timeout "${NMKIT_SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool $tool --error-exitcode 9 \
      $BUILD/tests/nmkit_gpu_tests --gtest_filter="${NMKIT_SANITIZE_TESTS:-Nm24Gpu.ShapesWithTails*:Nm24Gpu.Unaligned*:Nm24Gpu.SplitK*:Nm24Gpu.EverySm90*:VnmGpu.EverySm90*:VnmGpu.EveryHopperTileWidth:VnmGpu.Fallbacks*:TileGpu.Skewed*:TileGpu.LayoutsAndEpilogues:TileGpu.HopperPersistent*:TileGpu.HopperTimeline*:QuantizeTokensGpu.*:Nm24x8Gpu.*:AttentionGpu.TailsAndUnequalLengths:AttentionGpu.VariableLengths:AttentionOpsGpu.*:SparseLinearGpu.TheCallersWorkspace*:TransposeGpu.*:VnmGpu.RowGatherSplitK*}" >/tmp/nmkit_san.log 2>&1
    rc=$?
    { echo "=== $tool (rc $rc)"; grep -v "^\[" /tmp/nmkit_san.log | head -80; } >>"$OUT/sanitizer.log"
    tail -3 /tmp/nmkit_san.log
    [ $rc -ne 0 ] && grep -m 12 -E "Error|Warning|hazard|at 0x|in .*nm24" /tmp/nmkit_san.log
    verdict=$([ $rc -eq 0 ] && echo clean || echo "FAILED (rc $rc)")
    [ $rc -eq 124 ] && verdict="not finished: cut at ${NMKIT_SANITIZE_TIMEOUT:-600} s"
    summary+=("compute-sanitizer $tool: $verdict")
  done
fi

if [ -z "${NMKIT_BENCH_SKIP:-}" ]; then
  step "benchmark ${bench_args[*]}"
  timeout 900 $BUILD/bench/nmkit_bench "${bench_args[@]}" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  python3 bench/plot_speedup.py "$OUT/bench.json" "$OUT/speedup.png" || echo "plot failed"
  # NMKIT_BENCH_REPEAT=N: the same benchmark N times in all (bench2.json ... benchN.json; their tables appended to
  # bench.txt), and the per-row medians of the ratios printed last (bench/median_ratios.py).
  bench_jsons=("$OUT/bench.json")
  for ((run = 2; run <= repeats; ++run)); do
    step "benchmark ${bench_args[*]}, run $run of $repeats"
    echo "=== run $run of $repeats" >>"$OUT/bench.txt"
    timeout 900 $BUILD/bench/nmkit_bench "${bench_args[@]}" --json "$OUT/bench$run.json" 2>&1 | tee -a "$OUT/bench.txt"
    bench_jsons+=("$OUT/bench$run.json")
  done
fi

if [ -n "${NMKIT_BENCH_VNM:-}" ]; then
  # Several runs may be separated by ';': run i writes vnm<i>.json / vnm<i>.txt (the first: vnm.json, vnm.txt).
  IFS=';' read -ra vnm_runs <<<"$NMKIT_BENCH_VNM"
  for i in "${!vnm_runs[@]}"; do
    tag=$([ "$i" -eq 0 ] && echo "" || echo "$((i + 1))")
    step "benchmark ${vnm_runs[$i]}"
    # shellcheck disable=SC2086  # the run holds several arguments
    timeout "${NMKIT_BENCH_TIMEOUT:-900}" $BUILD/bench/nmkit_bench ${vnm_runs[$i]} --json "$OUT/vnm$tag.json" 2>&1 | tee "$OUT/vnm$tag.txt"
  done
  python3 bench/plot_vnm.py "$OUT/vnm.json" "$OUT" || echo "plot failed"
  python3 bench/plot_tile.py "$OUT/vnm.json" "$OUT/tile_speedup.png" || echo "plot failed"
fi

if [ -n "${NMKIT_BENCH_TORCH:-}" ]; then
  step "PyTorch linear layers: F.linear, torch 2:4 (cuSPARSELt), nmkit.torch.SparseLinear (bench/torch_linear.py)"
  # shellcheck disable=SC2086  # the variable holds the script's arguments
  PYTHONPATH=$BUILD/python timeout 600 python3 bench/torch_linear.py --json "$OUT/torch_linear.json" $NMKIT_BENCH_TORCH 2>&1 | tee "$OUT/torch_linear.txt"
fi

if [ -n "${NMKIT_BENCH_ATTENTION:-}" ]; then
  step "attention: SDPA flash and cuDNN, nmkit dense and 2:4 (bench/torch_attention.py)"
  # shellcheck disable=SC2086  # the variable holds the script's arguments
  PYTHONPATH=$BUILD/python timeout 600 python3 bench/torch_attention.py --json "$OUT/torch_attention.json" $NMKIT_BENCH_ATTENTION 2>&1 | tee "$OUT/torch_attention.txt"
fi

if [ -n "${NMKIT_ATTENTION_KERNEL:-}" ]; then
  step "attention kernel alone: fused dense and 2:4, the unfused pipeline (nmkit_attention_bench)"
  # shellcheck disable=SC2086  # the variable holds the benchmark's arguments
  timeout 600 $BUILD/bench/nmkit_attention_bench --json "$OUT/attention_kernel.json" $NMKIT_ATTENTION_KERNEL 2>&1 | tee "$OUT/attention_kernel.txt"
fi

if [ -n "${NMKIT_COPY_PROBE:-}" ]; then
  step "copy probe (bench/gpu/copy_probe.cu)"
  timeout 300 $BUILD/bench/nmkit_copy_probe 2>&1 | tee "$OUT/copy_probe.txt"
fi

if [ -n "${NMKIT_BENCH_AUTOTUNE:-}" ]; then
  step "benchmark with autotuned tiles ${bench_args[*]}"
  $BUILD/bench/nmkit_bench "${bench_args[@]}" --autotune --no-cusparselt 2>&1 | tee "$OUT/bench_autotune.txt"
fi

step "summary"
printf '%s\n' "${summary[@]}"
echo
[ -f "$OUT/bench.txt" ] && grep -v "^cuSPARSELt skipped" "$OUT/bench.txt"
[ -f "$OUT/torch_linear.txt" ] && cat "$OUT/torch_linear.txt"
if [ "$repeats" -gt 1 ] && [ -z "${NMKIT_BENCH_SKIP:-}" ]; then
  echo; echo "medians over $repeats runs:"
  python3 bench/median_ratios.py "${bench_jsons[@]}"
fi
for f in "$OUT"/vnm*.txt; do [ -f "$f" ] && grep -E "^vnm" "$f" | awk '{print $2, $3, $4, $5, $8, "ideal", $10, $NF}'; done
# Several NMKIT_BENCH_VNM runs (the same arguments repeated, e.g. "--suite tile ...;--suite tile ..."): the per-row
# medians over them, each pattern a row of its own.
vnm_jsons=("$OUT"/vnm*.json)
if [ ${#vnm_jsons[@]} -gt 1 ] && [ -f "${vnm_jsons[0]}" ]; then
  echo; echo "medians over the ${#vnm_jsons[@]} NMKIT_BENCH_VNM runs:"
  python3 bench/median_ratios.py "${vnm_jsons[@]}"
fi
exit 0
