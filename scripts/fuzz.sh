#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer harnesses of fuzz/ with clang (ASan + UBSan, no CUDA) in build/fuzz and runs each
# for FUZZ_SECONDS (default 60) over a scratch copy of its committed corpus (fuzz/corpus/<target>/), so that runs
# never grow the committed corpus. Prints one line per target; exits non-zero if any target crashed (a sanitizer
# report, an uncaught exception other than nmkit::Error, a failed property, a timeout or running out of memory).
# The library's other dependencies come from scripts/setup.sh (the Makefile runs it first).
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
JOBS="${JOBS:-$(nproc)}"
TARGETS=(safetensors model_loader format)
BUILD=build/fuzz
RUN="$BUILD/run"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# A clang that links a fuzzer with both sanitizers: clang++ on PATH, else the newest versioned one, else installed
# from Debian (clang, its compiler-rt with libFuzzer, and the LLVM OpenMP runtime that find_package(OpenMP) needs).
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe_dir/probe.cpp"
links_fuzzer() {
  command -v "$1" >/dev/null 2>&1 &&
    "$1" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" >/dev/null 2>&1
}
find_clang() {
  local cxx
  for cxx in clang++ $(compgen -c clang++- | grep -E '^clang\+\+-[0-9]+$' | sort -t- -k2 -rn | uniq); do
    if links_fuzzer "$cxx"; then
      echo "$cxx"
      return 0
    fi
  done
  return 1
}
packages=(clang libclang-rt-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
CXX_FUZZ="$(find_clang || true)"
if [ -z "$CXX_FUZZ" ] || [[ " ${missing[*]} " == *" libomp-dev "* ]]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "fuzz: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  CXX_FUZZ="$(find_clang)" || { echo "fuzz: no clang++ here links -fsanitize=fuzzer,address,undefined" >&2; exit 1; }
fi

echo "fuzz: building the harnesses with $CXX_FUZZ in $BUILD"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=Debug \
  -DNMKIT_ENABLE_CUDA=OFF -DNMKIT_BUILD_PYTHON=OFF -DNMKIT_BUILD_TESTS=OFF -DNMKIT_BUILD_TOOLS=OFF \
  -DNMKIT_BUILD_FUZZERS=ON >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log" >&2; exit 1; }
cmake --build "$BUILD" --target nmkit_fuzzers -j "$JOBS"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
failed=0
summary=()
for target in "${TARGETS[@]}"; do
  dir="$RUN/$target"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp fuzz/corpus/"$target"/* "$dir/corpus/"
  dict=()
  if [ -f "fuzz/$target.dict" ]; then dict=(-dict="fuzz/$target.dict"); fi
  set +e
  "$BUILD/fuzz/fuzz_$target" "$dir/corpus" "${dict[@]}" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" >"$dir/log.txt" 2>&1
  rc=$?
  set -e
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log.txt" | tail -1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log.txt" | tail -1)"
  crashes="$(find "$dir/artifacts" -type f | wc -l)"
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi  # died without writing an input (e.g. a signal)
  if [ "$crashes" -eq 0 ]; then
    line="fuzz $target: ${runs:-?} runs in ${FUZZ_SECONDS} s (${speed:-?} exec/s), 0 crashes"
  else
    line="fuzz $target: ${runs:-?} runs (${speed:-?} exec/s), $crashes crashes: stopped at the first"
  fi
  summary+=("$line")
  echo "$line"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    echo "---- $target: the end of $dir/log.txt" >&2
    grep -v -E '^#[0-9]+' "$dir/log.txt" | tail -40 >&2
    for input in "$dir"/artifacts/*; do
      [ -f "$input" ] && echo "fuzz $target: reproduce with $BUILD/fuzz/fuzz_$target $input" >&2
    done
  fi
done

echo "fuzz: summary"
printf '  %s\n' "${summary[@]}"
exit "$failed"
