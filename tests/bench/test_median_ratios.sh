#!/usr/bin/env bash
# bench/median_ratios.py on synthetic runs with known ratios: medians, ranges, searched and default baselines kept apart,
# tile rows of one shape told apart by their pattern,
# the variant column, rows missing from some runs, and the errors for no arguments and for a file without rows.
#   tests/bench/test_median_ratios.sh <repository root>
set -euo pipefail
root=$1
script="$root/bench/median_ratios.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Every run: nmkit 1 ms and cuBLAS 1.5 ms, so that cuSPARSELt's time is also nmkit's ratio against it; the decode
# row only in run 1.
write_run() {  # file, cuSPARSELt ms, searched (true/false), variant ms, more rows
  cat >"$1" <<JSON
{"rows": [
 {"suite": "llm", "r": 11008, "k": 4096, "c": 4096, "dtype": "bf16", "cublas_ms": 1.5, "nmkit_ms": 1.0,
  "speedup_vs_cublas": 1.5, "cusparselt_ms": $2, "nmkit_vs_cusparselt": $2, "cusparselt_searched": $3,
  "variant_ms": $4, "nmkit_rel_error": 1e-5, "nmkit_config": "sm90_wgmma_sp"}$5
]}
JSON
}
decode=',
 {"suite": "decode", "r": 11008, "k": 4096, "c": 1, "dtype": "bf16", "cublas_ms": 0.03, "nmkit_ms": 0.02,
  "speedup_vs_cublas": 1.5, "nmkit_rel_error": 1e-5, "nmkit_config": "sm90_wgmma_sp"}'
write_run "$dir/a.json" 0.97 true 1.02 "$decode"
write_run "$dir/b.json" 1.04 true 0.99 ""
write_run "$dir/c.json" 1.01 false 1.00 ""

out=$(python3 "$script" "$dir/a.json" "$dir/b.json" "$dir/c.json")
echo "$out"
fail() { echo "FAILED: $*"; exit 1; }
grep -qF "| llm | 11008x4096x4096 | bf16 | 3 | 1.50x | 1.005x (0.970-1.040) searched in 2 of 3 runs | 1.000x |" <<<"$out" ||
  fail "the llm row's medians, over the searched runs only"
grep -qF "| decode | 11008x4096x1 | bf16 | 1 | 1.50x | n/a | n/a |" <<<"$out" || fail "a row of one run without cuSPARSELt"
write_run "$dir/d.json" 1.20 false 1.00 ""
write_run "$dir/e.json" 1.30 false 1.00 ""
out=$(python3 "$script" "$dir/d.json" "$dir/e.json")
grep -qF "| llm | 11008x4096x4096 | bf16 | 2 | 1.50x | 1.250x (1.200-1.300) default cfg | 1.000x |" <<<"$out" ||
  fail "a row whose every run fell back to the default configuration"

# Tile rows: one shape and dtype, two densities, kept apart; the cuSPARSE BSR column appears with its median.
tile_row() {  # density, nmkit x cuBLAS, nmkit x BSR
  echo "{\"suite\": \"tile\", \"r\": 4096, \"k\": 4096, \"c\": 32, \"dtype\": \"f16\", \"tile\": 64, \"density\": $1,
   \"distribution\": \"uniform\", \"speedup_vs_cublas\": $2, \"nmkit_vs_cusparse_bsr\": $3}"
}
echo "{\"rows\": [$(tile_row 0.5 1.2 10), $(tile_row 0.25 1.5 20)]}" >"$dir/t1.json"
echo "{\"rows\": [$(tile_row 0.5 1.4 30), $(tile_row 0.25 1.7 40)]}" >"$dir/t2.json"
out=$(python3 "$script" "$dir/t1.json" "$dir/t2.json")
echo "$out"
grep -qF "| tile | 4096x4096x32 tile=64 density=0.5 distribution=uniform | f16 | 2 | 1.30x | n/a | n/a | 20.00x |" <<<"$out" ||
  fail "the tile row at density 0.5"
grep -qF "| tile | 4096x4096x32 tile=64 density=0.25 distribution=uniform | f16 | 2 | 1.60x | n/a | n/a | 30.00x |" <<<"$out" ||
  fail "the tile row at density 0.25, apart from 0.5"
grep -qF "nmkit x cuSPARSE BSR |" <<<"$out" || fail "the BSR column's header"
if grep -qF "fixed indices" <<<"$out"; then fail "no V:N:M column without V:N:M rows"; fi

if python3 "$script" >/dev/null 2>&1; then fail "no arguments must be an error"; fi
echo '{"rows": []}' >"$dir/empty.json"
if msg=$(python3 "$script" "$dir/empty.json" 2>&1); then fail "a file without rows must be an error"; fi
grep -q "no benchmark rows" <<<"$msg" || fail "the error names the empty file: $msg"
echo '{"rows": [{"suite": "llm", "r": 1, "k": 1, "c": 1, "dtype": "f16"}]}' >"$dir/partial.json"
if msg=$(python3 "$script" "$dir/partial.json" 2>&1); then fail "a row without its ratios must be an error"; fi
grep -q "speedup_vs_cublas" <<<"$msg" || fail "the error names the missing field: $msg"
echo "median_ratios.py: every check passed"
