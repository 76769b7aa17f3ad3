#!/usr/bin/env bash
# bench/launch_times.py on a synthetic run with known launch times: the first round's median, the second half's
# median and their ratio per library, and the errors for no arguments, a run without launch times and too few launches.
#   tests/bench/test_launch_times.sh <repository root>
set -euo pipefail
root=$1
script="$root/bench/launch_times.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

# 12 launches a library (three rounds of 4): nmkit 1.0 ms in its first round, then 1.2; cuBLAS 2.0 throughout.
cat >"$dir/run.json" <<'JSON'
{"rows": [{"suite": "llm", "r": 8192, "k": 8192, "c": 8192, "dtype": "bf16",
  "launch_ms": {"cublas": [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
                "nmkit": [1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2]}}]}
JSON
out=$(python3 "$script" "$dir/run.json")
echo "$out"
grep -qF "| 8192x8192x8192 | bf16 | nmkit | 12 | 1.0000 | 1.2000 | 1.200x |" <<<"$out" || fail "nmkit's first and settled medians"
grep -qF "| 8192x8192x8192 | bf16 | cublas | 12 | 2.0000 | 2.0000 | 1.000x |" <<<"$out" || fail "cuBLAS's, which never moves"

if python3 "$script" >/dev/null 2>&1; then fail "no arguments must be an error"; fi
echo '{"rows": [{"r": 1, "k": 1, "c": 1, "dtype": "f16"}]}' >"$dir/plain.json"
if msg=$(python3 "$script" "$dir/plain.json" 2>&1); then fail "a run without launch times must be an error"; fi
grep -q "launch-times" <<<"$msg" || fail "the error says how to get launch times: $msg"
echo '{"rows": [{"r": 1, "k": 1, "c": 1, "dtype": "f16", "launch_ms": {"nmkit": [1, 1, 1]}}]}' >"$dir/short.json"
if msg=$(python3 "$script" "$dir/short.json" 2>&1); then fail "fewer than two rounds must be an error"; fi
grep -q "fewer than two rounds" <<<"$msg" || fail "the error names the short library: $msg"
echo "launch_times.py: every check passed"
