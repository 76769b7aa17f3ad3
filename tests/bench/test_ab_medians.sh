#!/usr/bin/env bash
# bench/ab_medians.py on a synthetic A/B: per-row medians of each build's runs, their ratio, the floor's verdict,
# rows only one build has, and the error for a directory without pairs.
#   tests/bench/test_ab_medians.sh <repository root>
set -euo pipefail
root=$1
script="$root/bench/ab_medians.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

row() {  # V:N:M M, nmkit x cuBLAS
  echo "{\"suite\": \"vnm\", \"r\": 11008, \"k\": 4096, \"c\": 4096, \"dtype\": \"f16\", \"v\": 128, \"m\": $1,
   \"b_layout\": \"row\", \"speedup_vs_cublas\": $2}"
}
# M = 8: this 2.0, 2.2, 2.1 (median 2.1) against 2.0, 2.0 (ratio 1.05); M = 16: 3.0 against 3.2, 3.4 (0.909).
echo "{\"rows\": [$(row 8 2.0), $(row 16 3.0)]}" >"$dir/1.this.json"
echo "{\"rows\": [$(row 8 2.2)]}" >"$dir/2.this.json"
echo "{\"rows\": [$(row 8 2.1)]}" >"$dir/3.this.json"
echo "{\"rows\": [$(row 8 2.0), $(row 16 3.2), $(row 32 5.0)]}" >"$dir/1.ref.json"
echo "{\"rows\": [$(row 8 2.0), $(row 16 3.4)]}" >"$dir/2.ref.json"

set +e
out=$(python3 "$script" "$dir")
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || fail "a row under the floor must exit with 1, got $rc"
grep -qE "m=8 .* 3/2 +2\.10x +2\.00x +1\.050$" <<<"$out" || fail "the M = 8 row: medians over 3 and 2 runs, ratio 1.05"
grep -qE "m=16 .* 1/2 +3\.00x +3\.30x +0\.909  < floor$" <<<"$out" || fail "the M = 16 row under the floor"
if grep -qF "m=32" <<<"$out"; then fail "a row only the reference has is not compared"; fi
grep -qF "# worst this/ref 0.909; 1 row(s) under 0.97" <<<"$out" || fail "the summary line"
python3 "$script" "$dir" --floor 0.9 >/dev/null || fail "with --floor 0.9 every row passes"

mkdir "$dir/none"
if python3 "$script" "$dir/none" 2>/dev/null; then fail "a directory without pairs must be an error"; fi
echo "ab_medians: all checks passed"
