#!/usr/bin/env bash
# The CLI end to end on the real model: info, prune to each format, inspect, demo, and errors.
# Needs $NMKIT (the binary) and $NMKIT_MODEL (all-MiniLM-L6-v2 as safetensors).
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_error() {  # expect_error "fragment" cmd...: non-zero exit and one line on stderr naming the problem
  local fragment=$1; shift
  if "$@" >"$work/out" 2>"$work/err"; then fail "'$*' succeeded"; fi
  grep -q -- "$fragment" "$work/err" || fail "'$*' stderr lacks '$fragment': $(cat "$work/err")"
}

# Outputs go to a file before grep reads them: `cmd | grep -q` lets grep exit at its first match, and under
# pipefail the writer's SIGPIPE on its next line then fails the test (seen under a loaded CTest run).
"$NMKIT" --help >/dev/null
for sub in info prune inspect demo eval; do
  "$NMKIT" $sub --help >"$work/help.txt" || fail "$sub --help exited with $?"
  grep -qi usage "$work/help.txt" || fail "$sub --help"
done
if [ -x "$(dirname "$NMKIT")/../../bench/nmkit_bench" ]; then  # CUDA builds: bench hands its arguments to the driver
  "$NMKIT" bench --help >"$work/help.txt" || fail "bench --help exited with $?"
  grep -q -- "--suite" "$work/help.txt" || fail "bench --help does not show the driver's options"
fi
"$NMKIT" info >"$work/info.txt" || fail "info exited with $?"
grep -q "^nmkit " "$work/info.txt" || fail "info prints no version"

for format in 2:4 vnm:64:2:8 vnm:128:2:8 tile:64x64:0.25; do
  out="$work/pruned.safetensors"
  "$NMKIT" prune "$NMKIT_MODEL" -o "$out" --format "$format" --include '^encoder\.' >"$work/prune.txt"
  grep -q "total: 36 tensors pruned" "$work/prune.txt" || fail "$format: $(tail -3 "$work/prune.txt")"
  "$NMKIT" inspect "$out" >"$work/inspect.txt"
  case $format in tile:*) name="tile:64x64";; *) name=$format;; esac  # inspect names tile formats without density
  [ "$(grep -c "^encoder\.layer.*weight .* $name " "$work/inspect.txt")" -eq 36 ] || fail "$format: inspect lists the wrong tensors"
  grep -q "embeddings.word_embeddings.weight .* dense" "$work/inspect.txt" || fail "$format: embeddings were not kept dense"
done
# The Hopper tile kernel's steps on the last (tile) model: every pruned tensor has them, and pairing the tile rows
# by shared columns never takes more than neighbouring rows.
"$NMKIT" inspect --schedule "$out" >"$work/schedule.txt"
[ "$(grep -cE "^encoder\.layer.*weight .* tile:64x64 .* [0-9]+ +[0-9]+ +[0-9.]+$" "$work/schedule.txt")" -eq 36 ] ||
  fail "inspect --schedule lists the wrong tensors"
awk '/^tile steps of the Hopper kernel/ { if ($12 > $7) exit 1; found = 1 } END { exit !found }' "$work/schedule.txt" ||
  fail "inspect --schedule: $(tail -1 "$work/schedule.txt")"
# 2:4 of fp32 weights: values 50 % + 2-bit indices = 53.125 % of the pruned tensors' bytes.
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/p24.safetensors" --format 2:4 --include 'layer\.0\.' >"$work/p24.txt"
grep -q "53.12%" "$work/p24.txt" || fail "2:4 storage ratio: $(cat "$work/p24.txt")"

"$NMKIT" demo --model "$NMKIT_MODEL" --tokens 64 >"$work/demo.txt"
grep -q "all products verified" "$work/demo.txt" || fail "demo: $(cat "$work/demo.txt")"

# Activation-aware pruning calibrates on the model beside the input, and eval compares it with the dense model.
model_dir=$(dirname "$NMKIT_MODEL")
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/obs.safetensors" --format 2:4 --method obs --include '^encoder\.' \
  --calibration-sentences 32 >"$work/obs.txt" 2>"$work/obs.err"
grep -q "total: 36 tensors pruned" "$work/obs.txt" || fail "obs prune: $(tail -3 "$work/obs.txt")"
"$NMKIT" eval "$work/obs.safetensors" --model-dir "$model_dir" --eval-sentences 16 >"$work/eval.txt"
awk '/^file/ { if ($5 < 0.5 || $5 > 1.0) exit 1; found = 1 } END { exit !found }' "$work/eval.txt" ||
  fail "eval: $(cat "$work/eval.txt")"
# Fisher OBS: gradients for one layer, written as safetensors by plain Python.
python3 - "$work/grads.safetensors" <<'PY'
import json, random, struct, sys
name, shape = "encoder.layer.0.attention.self.query.weight", [2, 384, 384]
count = shape[0] * shape[1] * shape[2]
random.seed(1)
data = struct.pack(f"<{count}f", *(random.gauss(0.0, 1.0) for _ in range(count)))
header = json.dumps({name: {"dtype": "F32", "shape": shape, "data_offsets": [0, len(data)]}}).encode()
header += b" " * ((8 - len(header) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
PY
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/fisher.safetensors" --format vnm:64:2:8 --method obs --candidates pairwise \
  --fisher "$work/grads.safetensors" --include 'layer\.0\.attention\.self\.query' >"$work/fisher.txt"
grep -q "total: 1 tensors pruned" "$work/fisher.txt" || fail "fisher prune: $(cat "$work/fisher.txt")"
expect_error "no tensor 'encoder.layer.0.attention.self.key.weight'" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" \
  --format 2:4 --method obs --fisher "$work/grads.safetensors" --include 'layer\.0\.attention\.self\.key'
expect_error "unknown pruning method" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format 2:4 --method sgpt

expect_error "unknown format 'csr'" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format csr
expect_error "N in {1, 2}" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format vnm:64:3:8
expect_error "not a valid regex" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format 2:4 --include '('
printf 'garbage' >"$work/bad.safetensors"
expect_error "too short" "$NMKIT" inspect "$work/bad.safetensors"
printf '\xff\x00\x00\x00\x00\x00\x00\x00{}' >"$work/lying.safetensors"
expect_error "runs past the end" "$NMKIT" inspect "$work/lying.safetensors"
[ "$(wc -l <"$work/err")" -eq 1 ] || fail "errors must be one line"
expect_error "cannot create" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/no/such/dir/x.safetensors" --format 2:4
[ ! -e "$work/x.safetensors" ] || fail "a failed prune left an output file"
echo "cli end to end: ok"
