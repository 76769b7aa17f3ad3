#!/usr/bin/env bash
# bench/plot_models.py's summary on synthetic models runs with known ratios: rows at or above cuBLAS and
# cuSPARSELt (its searched configuration only), the geometric means at T <= 64 and over all, the rows under each
# baseline, medians over repeated runs, and the errors for a file without models rows and for runs from two GPUs.
#   tests/bench/test_models_summary.sh <repository root>
set -euo pipefail
script="$1/bench/plot_models.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 4096x4096 at T = 16 (0.5x cuBLAS, cuSPARSELt 0.4x), T = 64 (2x, cuSPARSELt 2.5x) and T = 4096 (1.6x; cuSPARSELt's
# default configuration only, 2x: left out of its counts).
cat >"$dir/run.json" <<JSON
{"rows": [
 {"suite": "models", "r": 4096, "k": 4096, "c": 16, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 0.5,
  "cusparselt_ms": 2.5},
 {"suite": "models", "r": 4096, "k": 4096, "c": 64, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 2.0,
  "cusparselt_ms": 0.4},
 {"suite": "models", "r": 4096, "k": 4096, "c": 4096, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 1.6,
  "cusparselt_ms": 0.5, "cusparselt_searched": false},
 {"suite": "llm", "r": 11008, "k": 4096, "c": 4096, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 9.0}
]}
JSON
out=$(python3 "$script" "$dir/run.json")
echo "$out"
expected="f16: 3 rows, 2 at or above cuBLAS, 1 of 2 at or above cuSPARSELt (searched); geometric mean over cuBLAS 1.000x at T <= 64, 1.170x over all
  under cuBLAS (1): 4096x4096x16 0.50x
  under cuSPARSELt (1): 4096x4096x64 2.00x against 2.50x"
[ "$out" = "$expected" ] || { echo "expected: $expected"; exit 1; }

# Two more runs of T = 16 (1.5x and 1.1x; cuSPARSELt 0.5x in one, absent in the other): the row's medians are 1.1x
# and 0.45x; a part holding only T = 8 adds a row (geometric means (1.21 x 1.1 x 2)^(1/3), then with 1.6^(1/4)).
cat >"$dir/run2.json" <<JSON
{"rows": [
 {"suite": "models", "r": 4096, "k": 4096, "c": 16, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 1.5,
  "cusparselt_ms": 2.0},
 {"suite": "models", "r": 4096, "k": 4096, "c": 8, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 1.21}
]}
JSON
echo '{"rows": [{"suite": "models", "r": 4096, "k": 4096, "c": 16, "dtype": "f16", "cublas_ms": 1.0,
  "speedup_vs_cublas": 1.1}]}' >"$dir/run3.json"
out=$(python3 "$script" "$dir/run.json" "$dir/run2.json" "$dir/run3.json")
echo "$out"
expected="f16: 4 rows (medians of 1-3 runs a row), 4 at or above cuBLAS, 1 of 2 at or above cuSPARSELt (searched); geometric mean over cuBLAS 1.386x at T <= 64, 1.437x over all
  under cuSPARSELt (1): 4096x4096x64 2.00x against 2.50x"
[ "$out" = "$expected" ] || { echo "expected: $expected"; exit 1; }

echo '{"gpu": "NVIDIA H200", "rows": []}' >"$dir/h200.json"
echo '{"gpu": "NVIDIA H100 80GB HBM3", "rows": []}' >"$dir/h100.json"
if python3 "$script" "$dir/run.json" "$dir/h200.json" "$dir/h100.json" 2>"$dir/err"; then
  echo "runs from two GPUs must fail"; exit 1
fi
grep -q "runs from different GPUs" "$dir/err"

echo '{"rows": [{"suite": "llm", "r": 1, "k": 1, "c": 1, "dtype": "f16", "cublas_ms": 1, "speedup_vs_cublas": 1}]}' \
  >"$dir/none.json"
if python3 "$script" "$dir/none.json" 2>"$dir/err"; then echo "a file without models rows must fail"; exit 1; fi
grep -q "no rows of the models suite" "$dir/err"
echo "plot_models summary: ok"
