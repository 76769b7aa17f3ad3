#!/usr/bin/env bash
# bench/plot_models.py's summary on a synthetic models run with known ratios: rows at or above cuBLAS and
# cuSPARSELt, the geometric means at T <= 64 and over all, and the error for a file without models rows.
#   tests/bench/test_models_summary.sh <repository root>
set -euo pipefail
script="$1/bench/plot_models.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 4096x4096 at T = 16 (0.5x cuBLAS, cuSPARSELt 0.4x), T = 64 (2x, cuSPARSELt 2.5x) and T = 4096 (1.6x, no cuSPARSELt).
cat >"$dir/run.json" <<JSON
{"rows": [
 {"suite": "models", "r": 4096, "k": 4096, "c": 16, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 0.5,
  "cusparselt_ms": 2.5},
 {"suite": "models", "r": 4096, "k": 4096, "c": 64, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 2.0,
  "cusparselt_ms": 0.4},
 {"suite": "models", "r": 4096, "k": 4096, "c": 4096, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 1.6},
 {"suite": "llm", "r": 11008, "k": 4096, "c": 4096, "dtype": "f16", "cublas_ms": 1.0, "speedup_vs_cublas": 9.0}
]}
JSON
out=$(python3 "$script" "$dir/run.json")
echo "$out"
expected="f16: 3 rows, 2 at or above cuBLAS, 1 of 2 at or above cuSPARSELt; geometric mean over cuBLAS 1.000x at T <= 64, 1.170x over all"
[ "$out" = "$expected" ] || { echo "expected: $expected"; exit 1; }

echo '{"rows": [{"suite": "llm", "r": 1, "k": 1, "c": 1, "dtype": "f16", "cublas_ms": 1, "speedup_vs_cublas": 1}]}' \
  >"$dir/none.json"
if python3 "$script" "$dir/none.json" 2>"$dir/err"; then echo "a file without models rows must fail"; exit 1; fi
grep -q "no rows of the models suite" "$dir/err"
echo "plot_models summary: ok"
