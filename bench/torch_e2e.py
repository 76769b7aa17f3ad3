"""End to end: a Llama-2-7B-shaped decoder stack in PyTorch, its linear layers dense, on nmkit's sparse kernels or on
PyTorch's own 2:4 tensor, prefill and decode, every variant side by side in one process.

    PYTHONPATH=build/gpu/python python3 bench/torch_e2e.py --json $OUT/torch_e2e.json [--layers 4] [--context 1024]
        [--rounds 15] [--quick] [--variants dense nm24 vnm vnm_fm tile torch24 dfss fp8] [--dtype f16|bf16] [--tile-density 0.5]
    PYTHONPATH=.deps/torch:.deps/py python3 bench/torch_e2e.py --device cpu --tiny    # the dry run, no GPU

The GPU run needs nmkit's Python extension built with CUDA first, as scripts/gpu_check.sh builds it (the device call
carrying .deps/re2, which scripts/carry_re2.sh makes); one device command, the extension alone built:
    source scripts/gpu_env.sh && cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="90a;80" -DNMKIT_DEFAULT_MODEL=/model-not-carried >/dev/null && \
    cmake --build build/gpu --target _nmkit && \
    PYTHONPATH=build/gpu/python python3 bench/torch_e2e.py --json $OUT/torch_e2e.json | tee $OUT/torch_e2e.txt
Without nmkit the dense and torch 2:4 rows still run.

The model: --layers decoder layers of Llama's architecture at Llama-2-7B's shapes (hidden 4096, 32 heads of 128,
SwiGLU FFN 11008, RMSNorm, rotary embeddings; projections without bias, q, k, v fused into one 12288x4096 Linear
and gate, up into one 22016x4096, as serving engines run them; --separate-projections keeps all seven), seeded
random weights of std K^-1/2; no embedding and no LM head: the input is hidden states. The elementwise work between
the linears (--glue): fused on the GPU, as serving engines run it (PyTorch's fused RMSNorm; the residual add with the
norm after it, the rotary embedding and the SwiGLU product each one torch.compile kernel), or eager, a kernel per step
as Hugging Face's Llama writes it; the same in every variant. Workloads: prefill of 1 x 2048
and 8 x 512 tokens (causal, the keys and values written to a cache as a serving prefill does) and decode of one new
token at batch 1, 16 and 64 against a static KV cache of --context tokens (random keys and values: their values
do not change the work), written in place at a position held in a device tensor and attended through a mask made
from it, so that a step is one CUDA graph. --quick: prefill 8 x 512 and decode at batch 16, fewer rounds, and
--prune-once (every layer its own device copy of the first layer's weights, one layer pruned on the CPU).

Variants, the same stack with other linear layers: dense (F.linear, cuBLAS); nmkit 2:4, vnm:128:2:8 and
tile:64x64:<--tile-density> (nmkit.torch.SparseLinear, each weight pruned by magnitude), vnm:128:2:8 with gate and
up writing their outputs feature-major (y^T, which down reads without a transpose); torch 2:4 (PyTorch's
semi-structured tensor on cuSPARSELt, the same 2:4 weights); for prefill, nmkit 2:4 with nmkit's DFSS attention
(each score row pruned to 2:4) in place of SDPA; and nmkit 2:4 with e4m3 values (a scale per row, x quantized per
token inside each call; its reference quantizes x the same way in PyTorch). Attention is otherwise
F.scaled_dot_product_attention.

How a row is timed: per workload, each variant's forward over all layers is captured in one CUDA graph on static
inputs (after two eager calls on a side stream, which make nmkit's plans). The replay is first checked against a
dense model holding the same pruned weights (for DFSS, with a PyTorch DFSS attention), run eagerly: the relative
error of what the layers add to the residual stream; a variant above --max-error is not timed. Then --warmup-s
seconds of replays of every variant in turn, then --rounds rounds: in each, every variant's graph is replayed `reps`
times back to back between two CUDA events (reps the same for all of a workload's variants, making a sample about
--sample-ms), the order rotating from round to round. Reported per row: the median ms per forward and per layer,
new tokens/s, the speed-up over dense (the median of the rounds' ratios), the relative error, and the peak of
PyTorch's allocations above what was resident while the row's graph was made; per variant the linear weights'
device bytes against dense (PyTorch's tensors counted by its allocator; nmkit's, allocated outside it, as the change
in the device's used memory when the layers were made); and torch.cuda.max_memory_allocated over the run.

The dry run (--device cpu --tiny: hidden 256, 4 heads of 64, FFN 688; dense only, eager, perf_counter) checks the
model, cache and step logic: a decode step against the cache a prefill wrote gives the last token of a prefill of
the whole sequence; the PyTorch DFSS reference's 2:4 choice against a brute-force one; and, where nmkit imports,
the pruned references. Pruning runs on the CPU, one weight per thread: 4 layers into the three formats took about
6 CPU-minutes on a development machine, shared by the device's cores; the log's timestamps show each phase.
"""
import argparse
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import statistics
import time
from typing import Optional

# Pruning runs one weight per thread over all cores; an OpenMP team inside each prune would oversubscribe them.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import nmkit
    import nmkit.torch as nmt
    WHY_NO_NMKIT = None
except ImportError as e:  # the dense and torch 2:4 rows still run
    WHY_NO_NMKIT = f"nmkit is not importable ({e})"

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
NMKIT_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f} s] {message}", flush=True)


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    layers: int
    eps: float = 1e-5
    rope_theta: float = 10000.0
    fused: bool = False  # q, k, v as one qkv_proj and gate, up as one gate_up_proj, as serving engines run them

    def projections(self) -> dict:
        """{name: (out_features, in_features)} of a layer's linear weights, in Llama's naming."""
        attn = self.heads * self.head_dim
        if self.fused:
            return {"qkv_proj": (3 * attn, self.hidden), "o_proj": (self.hidden, attn),
                    "gate_up_proj": (2 * self.ffn, self.hidden), "down_proj": (self.hidden, self.ffn)}
        return {"q_proj": (attn, self.hidden), "k_proj": (attn, self.hidden), "v_proj": (attn, self.hidden),
                "o_proj": (self.hidden, attn), "gate_proj": (self.ffn, self.hidden),
                "up_proj": (self.ffn, self.hidden), "down_proj": (self.hidden, self.ffn)}


LLAMA2_7B = dict(hidden=4096, heads=32, head_dim=128, ffn=11008)
TINY = dict(hidden=256, heads=4, head_dim=64, ffn=688)


@dataclasses.dataclass(frozen=True)
class Workload:
    kind: str  # "prefill" or "decode"
    batch: int
    tokens: int  # new tokens per sequence

    @property
    def name(self) -> str:
        return f"prefill {self.batch}x{self.tokens}" if self.kind == "prefill" else f"decode b{self.batch}"

    @property
    def new_tokens(self) -> int:
        return self.batch * self.tokens


def workloads(tiny: bool, quick: bool) -> list:
    prefill = [(1, 64), (4, 16)] if tiny else [(1, 2048), (8, 512)]
    decode = [1, 4] if tiny else [1, 16, 64]
    if quick:
        prefill, decode = prefill[1:], decode[1:2]
    return [Workload("prefill", b, t) for b, t in prefill] + [Workload("decode", b, 1) for b in decode]


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    name: str
    linear: str  # "dense", "nmkit" or "torch"
    format: Optional[str]  # the pruned weights it holds; None: the dense ones
    attention: str = "sdpa"  # in prefill: "sdpa" or "dfss"
    prefill_only: bool = False
    mlp_feature_major: bool = False  # gate and up write y^T (feature_major_output), which down reads in place


def all_variants(tile_density: float) -> list:
    tile = f"tile:64x64:{tile_density:g}"
    return [Variant("dense", "dense (F.linear)", "dense", None),
            Variant("nm24", "nmkit 2:4", "nmkit", "2:4"),
            Variant("vnm", "nmkit vnm:128:2:8", "nmkit", "vnm:128:2:8"),
            Variant("vnm_fm", "nmkit vnm:128:2:8, MLP feature-major", "nmkit", "vnm:128:2:8", mlp_feature_major=True),
            Variant("tile", f"nmkit {tile}", "nmkit", tile),
            Variant("torch24", "torch 2:4 (cuSPARSELt)", "torch", "2:4"),
            Variant("dfss", "nmkit 2:4 + DFSS attention", "nmkit", "2:4", attention="dfss", prefill_only=True),
            Variant("fp8", "nmkit 2:4 fp8 (e4m3, x per token)", "nmkit", FP8_24)]


FP8_24 = "2:4 e4m3"  # 2:4 with e4m3 values (a scale per row), x quantized per token inside each call
E4M3_MAX = 448.0


# The model: Llama's decoder layer (as transformers' LlamaDecoderLayer computes it) over linear layers given as
# callables x[..., K] -> y[..., R], so that every variant runs the same code around its own linears.

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Rope:
    """Rotary embedding tables, cos and sin [positions, head_dim], computed in fp32 and held in the model's dtype."""

    def __init__(self, cfg: Config, positions: int, dtype: torch.dtype, device: torch.device):
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device).float() / cfg.head_dim)
        angles = torch.outer(torch.arange(positions, device=device).float(), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin


def rotate_pair(q, k, cos, sin):
    return rotate(q, cos, sin), rotate(k, cos, sin)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, norm=rms_norm) -> tuple:
    """The residual stream plus a sublayer's output, and its RMSNorm."""
    h = h + delta
    return h, norm(h, weight, eps)


class Glue:
    """A layer's elementwise work around its linears and attention, the same in every variant. "eager": as Hugging
    Face's Llama writes it, a kernel per step (its RMSNorm in fp32 takes eight). "fused": as serving engines run it,
    PyTorch's fused RMSNorm, the residual add with the norm after it, the rotary embedding of q and k, and the SwiGLU
    product each compiled into one kernel by torch.compile (Inductor)."""

    KINDS = ("fused", "eager")

    def __init__(self, kind: str, eps: float):
        if kind not in self.KINDS:
            raise ValueError(f"glue must be one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        if kind == "eager":
            self.norm = functools.partial(rms_norm, eps=eps)
            self.rotate_pair, self.swiglu = rotate_pair, swiglu
            self.add_norm = functools.partial(add_norm, eps=eps)
        else:
            # A kernel per shape the run meets (sizes 1 specialise: batch 1, decode's one token; each workload, the
            # checks and the references): more than dynamo's default of 8, past which it would run them eagerly.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.norm = functools.partial(fused_rms_norm, eps=eps)
            self.rotate_pair, self.swiglu = torch.compile(rotate_pair), torch.compile(swiglu)
            self.add_norm = torch.compile(functools.partial(add_norm, eps=eps, norm=fused_rms_norm))


@dataclasses.dataclass
class KVCache:
    k: torch.Tensor  # [layers, batch, heads, length, head_dim]
    v: torch.Tensor

    @classmethod
    def allocate(cls, cfg: Config, batch: int, length: int, dtype, device, fill: Optional[float] = None):
        """A cache of `length` positions: zeros, or normal values of std `fill` (keys and values of a context)."""
        shape = (cfg.layers, batch, cfg.heads, length, cfg.head_dim)
        if fill is None:
            return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        return cls(torch.randn(shape, dtype=dtype, device=device).mul_(fill),
                   torch.randn(shape, dtype=dtype, device=device).mul_(fill))

    @property
    def length(self) -> int:
        return self.k.shape[3]


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def dfss_causal(q, k, v):
    return nmt.dfss_attention(q, k, v, causal=True)


def keep_24(scores: torch.Tensor) -> torch.Tensor:
    """Which scores DFSS keeps: in each group of 4 consecutive keys (from key 0) the 2 largest, ties to the lower
    key, -inf (masked) never."""
    keys = scores.shape[-1]
    padded = F.pad(scores, (0, -keys % 4), value=-math.inf)
    groups = padded.unflatten(-1, (-1, 4))
    mine, other = groups.unsqueeze(-1), groups.unsqueeze(-2)  # [..., i, 1] against [..., 1, j]
    lower = torch.ones(4, 4, dtype=torch.bool, device=scores.device).tril(-1)  # [i, j]: j < i
    beaten_by = ((other > mine) | ((other == mine) & lower)).sum(-1)
    keep = (beaten_by < 2) & (groups > -math.inf)
    return keep.flatten(-2)[..., :keys]


def dfss_reference(q, k, v):
    """Causal DFSS attention in PyTorch, fp32, one sequence at a time: the correctness guard's reference for
    nmkit.torch.dfss_attention."""
    out = torch.empty_like(q)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
    for b in range(q.shape[0]):
        scores = (q[b].float() @ k[b].float().transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(mask, -math.inf)
        scores = scores.masked_fill(~keep_24(scores), -math.inf)
        out[b] = (torch.softmax(scores, -1) @ v[b].float()).to(q.dtype)
    return out


CAUSAL_ATTENTION = {"sdpa": sdpa_causal, "dfss": dfss_causal, "dfss reference": dfss_reference}


class Stack:
    """The decoder layers: linears[i] maps a projection's name to its callable; norms[i] holds the two RMSNorm
    weights; `attention` names the prefill's causal attention (decode runs SDPA over the cache)."""

    def __init__(self, cfg: Config, linears: list, norms: list, rope: Rope, attention: str = "sdpa",
                 glue: Optional[Glue] = None):
        self.cfg, self.linears, self.norms, self.rope = cfg, linears, norms, rope
        self.causal = CAUSAL_ATTENTION[attention]
        self.glue = glue or Glue("eager", cfg.eps)

    def _layer(self, h, i, cos, sin, attend):
        cfg, linear = self.cfg, self.linears[i]
        batch, seq, _ = h.shape

        def heads(t):
            return t.view(batch, seq, cfg.heads, cfg.head_dim).transpose(1, 2)

        glue = self.glue
        x = glue.norm(h, self.norms[i][0])
        if cfg.fused:
            q, k, v = linear["qkv_proj"](x).split(cfg.heads * cfg.head_dim, dim=-1)
        else:
            q, k, v = linear["q_proj"](x), linear["k_proj"](x), linear["v_proj"](x)
        o = attend(i, *glue.rotate_pair(heads(q), heads(k), cos, sin), heads(v))
        h, x = glue.add_norm(h, linear["o_proj"](o.transpose(1, 2).reshape(batch, seq, cfg.heads * cfg.head_dim)),
                             self.norms[i][1])
        if cfg.fused:
            gate, up = linear["gate_up_proj"](x).split(cfg.ffn, dim=-1)
        else:
            gate, up = linear["gate_proj"](x), linear["up_proj"](x)
        return h + linear["down_proj"](glue.swiglu(gate, up))

    def prefill(self, x: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """x [B, S, hidden] at positions 0 to S - 1; writes their keys and values to `cache` when given."""
        seq = x.shape[1]

        def attend(i, q, k, v):
            if cache is not None:
                cache.k[i, :, :, :seq].copy_(k)
                cache.v[i, :, :, :seq].copy_(v)
            return self.causal(q, k, v)

        for i in range(len(self.linears)):
            x = self._layer(x, i, self.rope.cos[:seq], self.rope.sin[:seq], attend)
        return x

    def decode(self, x: torch.Tensor, cache: KVCache, pos: torch.Tensor) -> torch.Tensor:
        """x [B, 1, hidden], one new token per sequence at position pos (a 1-element int64 device tensor, so that
        the step reads it on the device and a CUDA graph of it stays valid): its key and value written to the cache
        there, attending to the cache's positions 0 to pos."""
        cos, sin = self.rope.cos.index_select(0, pos), self.rope.sin.index_select(0, pos)
        visible = (torch.arange(cache.length, device=x.device) <= pos).view(1, 1, 1, -1)

        def attend(i, q, k, v):
            cache.k[i].index_copy_(2, pos, k)
            cache.v[i].index_copy_(2, pos, v)
            return F.scaled_dot_product_attention(q, cache.k[i], cache.v[i], attn_mask=visible)

        for i in range(len(self.linears)):
            x = self._layer(x, i, cos, sin, attend)
        return x


class DenseLinear:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x):
        return F.linear(x, self.weight)


class QuantizedXLinear:
    """The fp8 variant's reference: x quantized per token to e4m3 as nmkit does (scale = absmax / 448 in fp32, codes
    rounded to nearest even) and dequantized, times the dequantized weight, in fp32."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.float()

    def __call__(self, x):
        scale = x.float().abs().amax(dim=-1, keepdim=True) / E4M3_MAX
        codes = (x.float() / torch.where(scale > 0, scale, torch.ones_like(scale))).to(torch.float8_e4m3fn)
        return F.linear(codes.float() * scale, self.weight).to(x.dtype)


class TorchSemiStructured:
    """PyTorch's 2:4 tensor on cuSPARSELt (its CUTLASS backend refuses Hopper), called on x flattened to 2-D."""

    def __init__(self, weight: torch.Tensor):
        self.weight = torch.sparse.SparseSemiStructuredTensorCUSPARSELT.from_dense(weight)

    def __call__(self, x):
        y = F.linear(x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(*x.shape[:-1], y.shape[-1])


# Weights, pruning and the variants' layers.

def random_weights(cfg: Config, dtype, device, seed: int) -> list:
    """Per layer {name: weight [out, in]}; std K^-1/2 keeps the activations' scale through the layers."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return [{name: (torch.randn(shape, generator=generator, device=device) * shape[1] ** -0.5).to(dtype)
             for name, shape in cfg.projections().items()} for _ in range(cfg.layers)]


def prune_all(weights: list, formats: list, dtype) -> dict:
    """{format: per layer {name: (SparseWeight, the pruned weight dense on the CPU in `dtype`)}}, pruned by nmkit's
    magnitude pruning in a thread per core (nmkit.prune releases the GIL)."""
    host = [{name: w.float().cpu().numpy() for name, w in layer.items()} for layer in weights]

    def prune(array, spec):
        if spec == FP8_24:  # pruned, then the kept values quantized per row; to_dense() dequantizes (code x scale,
            sparse = nmkit.prune(array, "2:4", "fp8")  # kept in fp32: the kernel multiplies by the fp32 scales)
            return sparse, torch.from_numpy(sparse.to_dense())
        sparse = nmkit.prune(array, spec, NMKIT_DTYPES[dtype])
        return sparse, torch.from_numpy(sparse.to_dense()).to(dtype)

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        jobs = {spec: [{name: pool.submit(prune, array, spec) for name, array in layer.items()} for layer in host]
                for spec in formats}
        return {spec: [{name: job.result() for name, job in layer.items()} for layer in layers]
                for spec, layers in jobs.items()}


def used_outside_torch() -> int:
    """Device bytes in use that PyTorch's caching allocator does not hold (nmkit's cudaMalloc'd weights)."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


@functools.lru_cache(maxsize=None)
def load_nmkit_runtime(device, dtype) -> None:
    """Makes and runs one small layer, so that nmkit's CUDA runtime and kernels are loaded before weights are
    measured (they would count as the first nmkit variant's)."""
    import numpy
    layer = nmt.SparseLinear(nmkit.prune(numpy.ones((128, 128), numpy.float32), "2:4", NMKIT_DTYPES[dtype]),
                             device=device)
    layer(torch.zeros(16, 128, dtype=dtype, device=device))
    torch.cuda.synchronize()


def build_linears(variant: Variant, weights: list, pruned: dict, device) -> tuple:
    """The variant's linears (per layer {name: callable}) and what they hold on the device: {"device_bytes",
    "format_bytes" (nmkit's compressed storage, None for PyTorch's tensors)}."""
    if variant.linear == "dense":
        return ([{name: DenseLinear(w) for name, w in layer.items()} for layer in weights],
                {"device_bytes": sum(w.nbytes for layer in weights for w in layer.values()), "format_bytes": None})
    layers = pruned[variant.format]
    if variant.linear == "torch":
        before = torch.cuda.memory_allocated()
        linears = [{name: TorchSemiStructured(dense.to(device)) for name, (_, dense) in layer.items()}
                   for layer in layers]  # the dense copy each is made from is freed at once
        return linears, {"device_bytes": torch.cuda.memory_allocated() - before, "format_bytes": None}
    if WHY_NO_NMKIT:
        raise RuntimeError(WHY_NO_NMKIT)
    load_nmkit_runtime(device, weights[0]["o_proj"].dtype)
    before = used_outside_torch()
    dtype = weights[0]["o_proj"].dtype  # an 8-bit weight's x and y; a 16-bit one computes in its own
    linears = [{name: nmt.SparseLinear(sparse, device=device,
                                       dtype=dtype if isinstance(sparse, nmkit.QuantizedWeight) else None)
                for name, (sparse, _) in layer.items()} for layer in layers]
    if variant.mlp_feature_major:
        for layer in linears:
            for name in ("gate_up_proj", "gate_proj", "up_proj"):
                if name in layer:
                    layer[name].feature_major_output = True
    return linears, {"device_bytes": used_outside_torch() - before,
                     "format_bytes": sum(s.storage_bytes for layer in layers for s, _ in layer.values())}


def reference_linears(variant: Variant, weights: list, pruned: dict, device) -> list:
    """Dense linears holding the variant's pruned weights (the dense weights for dense)."""
    if variant.format is None:
        return [{name: DenseLinear(w) for name, w in layer.items()} for layer in weights]
    kind = QuantizedXLinear if variant.format == FP8_24 else DenseLinear
    return [{name: kind(dense.to(device)) for name, (_, dense) in layer.items()} for layer in pruned[variant.format]]


# Running and timing.

class Inputs:
    """A workload's static inputs, shared by all variants: x and a cache (and for decode the position)."""

    def __init__(self, workload: Workload, cfg: Config, context: int, dtype, device, seed: int):
        torch.manual_seed(seed)
        self.workload = workload
        self.x = torch.randn(workload.batch, workload.tokens, cfg.hidden, dtype=dtype, device=device)
        if workload.kind == "prefill":
            self.cache, self.pos = KVCache.allocate(cfg, workload.batch, workload.tokens, dtype, device), None
        else:
            self.cache = KVCache.allocate(cfg, workload.batch, context + 1, dtype, device, fill=1.0)
            self.pos = torch.tensor([context], device=device)

    def forward(self, stack: Stack) -> torch.Tensor:
        if self.pos is None:
            return stack.prefill(self.x, self.cache)
        return stack.decode(self.x, self.cache, self.pos)


class Forward:
    """One variant's forward of one workload: on the GPU captured in a CUDA graph and replayed (returning the graph's
    static output), on the CPU the eager call."""

    def __init__(self, fn, graph: bool):
        self.fn, self.graph, self.out = fn, None, None
        if not graph:
            return
        side = torch.cuda.Stream()  # warm-up off the default stream, as PyTorch's capture notes advise
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


def sample_ms(forward: Forward, reps: int, cuda: bool) -> float:
    """Milliseconds per forward of `reps` back-to-back forwards: CUDA events on the GPU, the wall clock on the CPU."""
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(reps):
            forward()
        return (time.perf_counter() - t0) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        forward()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def time_workload(forwards: dict, args, cuda: bool) -> tuple:
    """({key: ms per forward, one per round}, reps): interleaved rounds, the order rotating."""
    names = list(forwards)
    deadline = time.perf_counter() + args.warmup_s  # to the clocks that sustained load settles to
    while time.perf_counter() < deadline:
        for name in names:
            sample_ms(forwards[name], 1, cuda)
    pace = forwards["dense"] if "dense" in forwards else forwards[names[0]]
    estimate = statistics.median(sample_ms(pace, 1, cuda) for _ in range(3))
    reps = max(1, math.ceil(args.sample_ms / estimate)) if cuda else 1
    samples = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(sample_ms(forwards[name], reps, cuda))
    return samples, reps


def residual_error(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> float:
    """Relative error of what the layers add to the residual stream (out - x), which the input would dilute."""
    added = want.float() - x.float()
    return ((got.float() - x.float() - added).norm() / added.norm()).item()


def nmkit_kernels(linears: list, tokens: int) -> dict:
    """The kernel each of layer 0's SparseLinears launches for `tokens` rows."""
    return {name: layer.kernel(tokens) for name, layer in linears[0].items() if hasattr(layer, "kernel")}


class Bench:
    """The run's state: the shared weights and inputs, each variant's layers and captured forwards, and the rows."""

    def __init__(self, args, cfg: Config, dtype, device):
        self.args, self.cfg, self.dtype, self.device = args, cfg, dtype, device
        self.cuda = device.type == "cuda"
        self.variants = [v for v in all_variants(args.tile_density) if v.key == "dense" or v.key in args.variants]
        self.loads = workloads(args.tiny, args.quick)
        log(f"{cfg.layers} layers (hidden {cfg.hidden}, {cfg.heads} heads of {cfg.head_dim}, FFN {cfg.ffn}), "
            f"{args.dtype}, context {args.context}; variants: {', '.join(v.name for v in self.variants)}")
        if args.prune_once:  # every layer its own device copy of the first layer's values
            first = random_weights(dataclasses.replace(cfg, layers=1), dtype, device, args.seed)[0]
            self.weights = [first] + [{name: w.clone() for name, w in first.items()} for _ in range(cfg.layers - 1)]
        else:
            self.weights = random_weights(cfg, dtype, device, args.seed)
        self.dense_bytes = sum(w.nbytes for layer in self.weights for w in layer.values())
        formats = sorted({v.format for v in self.variants if v.format})
        self.pruned = {}
        if formats and WHY_NO_NMKIT:
            log(f"pruning skipped: {WHY_NO_NMKIT}")
        elif formats:
            distinct = self.weights[:1] if args.prune_once else self.weights
            self.pruned = prune_all(distinct, formats, dtype)
            if args.prune_once:  # the same host weights; build_linears uploads a copy per layer
                self.pruned = {spec: layers * cfg.layers for spec, layers in self.pruned.items()}
            log(f"pruned {len(distinct) * len(cfg.projections())} weights into {', '.join(formats)} on the CPU")
        positions = max(64, args.context + 1, *(w.tokens for w in self.loads))  # 64: the checks' sequences
        self.rope = Rope(cfg, positions, dtype, device)
        self.norms = [(torch.ones(cfg.hidden, dtype=dtype, device=device),) * 2 for _ in range(cfg.layers)]
        self.glue = Glue(args.glue, cfg.eps)
        self.inputs = {w.name: Inputs(w, cfg, args.context, dtype, device, args.seed + i)
                       for i, w in enumerate(self.loads)}
        self.built, self.weight_info, self.forwards, self.rows, self.prefill_outputs = {}, {}, {}, {}, {}
        self.run_peak = 0  # PyTorch's peak over the run, which the per-row resets of its counter would lose

    def make(self, variant: Variant) -> None:
        """Builds the variant's layers (or reuses another variant's), captures its forward of every workload it
        runs, and checks each against the reference, keeping those within --max-error for timing."""
        mine = [w for w in self.loads if not (variant.prefill_only and w.kind == "decode")]
        rows = {w.name: self.rows.setdefault((variant.key, w.name), {"workload": w.name, "variant": variant.key,
                                                                      "name": variant.name}) for w in mine}
        try:
            built = (variant.linear, variant.format, variant.mlp_feature_major)
            if built not in self.built:
                self.built[built] = build_linears(variant, self.weights, self.pruned, self.device)
            linears, held = self.built[built]
        except Exception as e:  # noqa: BLE001 - the variant is reported, not timed
            for row in rows.values():
                row["error"] = f"not built: {type(e).__name__}: {e}"
            log(f"{variant.name}: not built ({type(e).__name__}: {e})")
            return
        self.weight_info[variant.key] = {**held, "fraction_of_dense": held["device_bytes"] / self.dense_bytes}
        stack = Stack(self.cfg, linears, self.norms, self.rope, variant.attention, self.glue)
        if variant.key == "dense":
            check_decode_matches_prefill(stack, self.cfg, self.dtype, self.device)
        for w in mine:
            try:
                self._capture(variant, w, stack, rows[w.name])
                if variant.linear == "nmkit":
                    rows[w.name]["kernels"] = nmkit_kernels(linears, w.new_tokens)
            except Exception as e:  # noqa: BLE001 - a workload this variant cannot run is reported, not timed
                rows[w.name]["error"] = f"not captured: {one_line(e)}"
        reference, why = None, None
        try:
            reference = Stack(self.cfg, reference_linears(variant, self.weights, self.pruned, self.device),
                              self.norms, self.rope, "dfss reference" if variant.attention == "dfss" else "sdpa",
                              self.glue)
        except Exception as e:  # noqa: BLE001 - the reference may not fit, say; then nothing of it is timed
            why = f"not checked: {one_line(e)}"
        for w in mine:
            if (variant.key, w.name) in self.forwards:
                try:
                    if why:
                        rows[w.name]["error"] = why
                    else:
                        self._check(variant, w, reference, rows[w.name])
                except Exception as e:  # noqa: BLE001
                    rows[w.name]["error"] = f"not checked: {one_line(e)}"
                if "error" in rows[w.name]:
                    del self.forwards[variant.key, w.name]
        del reference
        if self.cuda:
            torch.cuda.empty_cache()
        log(f"{variant.name}: made and checked " + ", ".join(
            f"{name} {row.get('rel_err', float('nan')):.1e}" for name, row in rows.items()))

    def _capture(self, variant: Variant, w: Workload, stack: Stack, row: dict) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.run_peak = max(self.run_peak, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
        try:
            with torch.inference_mode():
                forward = Forward(functools.partial(self.inputs[w.name].forward, stack), self.cuda)
        finally:
            if self.cuda:
                torch.cuda.synchronize()  # a failed capture's error surfaces here rather than in the next row
        self.forwards[variant.key, w.name] = forward
        if self.cuda:
            row["activation_peak_bytes"] = torch.cuda.max_memory_allocated() - resident

    def _check(self, variant: Variant, w: Workload, reference: Stack, row: dict) -> None:
        inputs = self.inputs[w.name]
        with torch.inference_mode():
            got = self.forwards[variant.key, w.name]().clone()
            row["rel_err"] = error = residual_error(got, inputs.forward(reference), inputs.x)
        if w.kind == "prefill" and variant.key in ("nm24", "dfss"):
            self.prefill_outputs[variant.key, w.name] = got
        if variant.key == "dfss" and ("nm24", w.name) in self.prefill_outputs:
            row["dfss_moves_output_by"] = residual_error(got, self.prefill_outputs["nm24", w.name], inputs.x)
        # x quantized per token turns small upstream differences (the kernel's and the reference's roundings) into
        # flipped e4m3 codes, which compound over the layers: the fp8 variant gets 2.5 times the bound.
        bound = self.args.max_error * (2.5 if variant.format == FP8_24 else 1.0)
        if not error <= bound:  # NaN too
            row["error"] = f"relative error {error:.2e} above {bound:.1e}"

    def time(self, w: Workload) -> None:
        timed = {key: forward for (key, name), forward in self.forwards.items() if name == w.name}
        if not timed:
            return
        with torch.inference_mode():
            samples, reps = time_workload(timed, self.args, self.cuda)
        dense = samples.get("dense")
        for key, times in samples.items():
            ms = statistics.median(times)
            self.rows[key, w.name].update(
                ms=ms, ms_per_layer=ms / self.cfg.layers, tokens_per_s=w.new_tokens / ms * 1e3, samples_ms=times,
                reps=reps, speedup_vs_dense=statistics.median(d / t for d, t in zip(dense, times)) if dense else None)
        log(f"timed {w.name}: {len(timed)} variants, {self.args.rounds} rounds of {reps} forwards")

    def result(self) -> dict:
        return {"suite": "e2e", "device": torch.cuda.get_device_name() if self.cuda else "cpu",
                "torch": torch.__version__, "nmkit": None if WHY_NO_NMKIT else nmkit.build_info(),
                "args": vars(self.args), "config": dataclasses.asdict(self.cfg), "dense_weight_bytes": self.dense_bytes,
                "weights": self.weight_info,
                "workloads": [dataclasses.asdict(w) | {"name": w.name} for w in self.loads],
                "rows": [self.rows[v.key, w.name] for w in self.loads for v in self.variants
                         if (v.key, w.name) in self.rows],
                "max_memory_allocated": max(self.run_peak, torch.cuda.max_memory_allocated()) if self.cuda else None}


def one_line(e: Exception) -> str:
    text = str(e).splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def bench(args, cfg: Config, dtype, device) -> dict:
    run = Bench(args, cfg, dtype, device)
    for variant in run.variants:
        run.make(variant)
    run.pruned = run.prefill_outputs = None  # the host's pruned copies and the checks' outputs are done with
    for w in run.loads:
        run.time(w)
    return run.result()


# Checks of the model's own logic (the dry run makes them all; the GPU run the first, on its dense stack).

DECODE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def check_decode_matches_prefill(stack: Stack, cfg: Config, dtype, device, seq: int = 24, batch: int = 2) -> float:
    """A decode step against the cache that a prefill of the first seq - 1 tokens wrote gives the last token's output
    of a prefill of all seq tokens. The cache has spare positions past the step's, holding large values that the
    mask must hide."""
    torch.manual_seed(1)
    x = torch.randn(batch, seq, cfg.hidden, dtype=dtype, device=device)
    cache = KVCache.allocate(cfg, batch, seq + 5, dtype, device, fill=100.0)
    with torch.inference_mode():
        full = stack.prefill(x)
        stack.prefill(x[:, :-1], cache)
        step = stack.decode(x[:, -1:], cache, torch.tensor([seq - 1], device=device))
    error = residual_error(step[:, 0], full[:, -1], x[:, -1])
    assert error < DECODE_TOLERANCE[dtype], f"decode step against the cache: relative error {error:.2e} ({dtype})"
    log(f"check: decode step at position {seq - 1} = last token of a {seq}-token prefill "
        f"(relative error {error:.1e}, {str(dtype).split('.')[1]})")
    return error


def check_keep_24() -> None:
    """keep_24 against a brute-force choice per group, on scores with many ties, causal masks and a ragged tail."""
    torch.manual_seed(2)
    scores = torch.randint(-3, 3, (3, 7, 14)).float()  # few distinct values: ties everywhere
    scores = scores.masked_fill(torch.ones(7, 14, dtype=torch.bool).triu(3), -math.inf)
    keep = keep_24(scores)
    for b, i in ((b, i) for b in range(3) for i in range(7)):
        row = scores[b, i].tolist()
        for g in range(0, 14, 4):
            group = [j for j in range(g, min(g + 4, 14)) if row[j] > -math.inf]
            chosen = set(sorted(group, key=lambda j: (-row[j], j))[:2])
            assert {j for j in range(g, min(g + 4, 14)) if keep[b, i, j]} == chosen, (b, i, g, row)
    log("check: the PyTorch DFSS reference keeps each group's 2 largest scores, ties to the lower key, masked never")


def check_pruned_references(cfg: Config, dtype, device, tile_density: float) -> None:
    """The pruned weights' path (nmkit.prune in threads, to_dense, the reference stacks) runs on the CPU, each weight
    keeping its format's share of entries."""
    if WHY_NO_NMKIT:
        log(f"check of the pruned references skipped: {WHY_NO_NMKIT}")
        return
    weights = random_weights(cfg, dtype, device, 3)
    formats = sorted({v.format for v in all_variants(tile_density) if v.format})
    pruned = prune_all(weights, formats, dtype)
    rope = Rope(cfg, 16, dtype, device)
    norms = [(torch.ones(cfg.hidden, dtype=dtype, device=device),) * 2 for _ in range(cfg.layers)]
    x = torch.randn(2, 16, cfg.hidden, dtype=dtype, device=device)
    for spec in formats:
        for layer in pruned[spec]:
            for name, (sparse, dense) in layer.items():
                kept = (dense != 0).float().mean().item()
                assert abs(kept - sparse.density) < 1e-3, f"{spec} {name}: {kept} of the entries kept"
        variant = next(v for v in all_variants(tile_density) if v.format == spec)
        with torch.inference_mode():
            out = Stack(cfg, reference_linears(variant, weights, pruned, device), norms, rope).prefill(x)
        assert torch.isfinite(out).all(), spec
    log(f"check: pruned references for {', '.join(formats)} (densities as the formats say, outputs finite)")


# The report.

def print_report(result: dict) -> None:
    cfg, args = result["config"], result["args"]
    how = ("eager, wall clock (the dry run)" if result["device"] == "cpu" else
           f"CUDA-graph replays, medians of {args['rounds']} interleaved rounds")
    print(f"\n{result['device']}, torch {result['torch']}, {args['dtype']}: {cfg['layers']} Llama layers (hidden "
          f"{cfg['hidden']}, {cfg['heads']} heads of {cfg['head_dim']}, FFN {cfg['ffn']}"
          f"{'; q/k/v and gate/up fused' if cfg.get('fused') else ''}), decode against {args['context']} cached "
          f"tokens; {args.get('glue', 'eager')} glue; {how}")
    names = {row["variant"]: row["name"] for row in result["rows"]}
    print(f"\n{'linear weights':30} {'device MB':>10} {'x dense':>8} {'format MB':>10}")
    for key, held in result["weights"].items():
        fmt = f"{held['format_bytes'] / 2**20:10.1f}" if held["format_bytes"] is not None else f"{'':10}"
        print(f"{names[key]:30} {held['device_bytes'] / 2**20:10.1f} {held['fraction_of_dense']:8.3f} {fmt}")
    print(f"\n{'workload':16} {'variant':30} {'ms/fwd':>9} {'ms/layer':>9} {'tokens/s':>11} {'x dense':>8} "
          f"{'rel.err':>8} {'act. MB':>8}")
    for row in result["rows"]:
        lead = f"{row['workload']:16} {row['name']:30}"
        if "ms" not in row:
            print(f"{lead} {row.get('error', 'not timed')[:110]}")
            continue
        speedup = f"{row['speedup_vs_dense']:7.2f}x" if row["speedup_vs_dense"] else f"{'-':>8}"
        peak = f"{row['activation_peak_bytes'] / 2**20:8.0f}" if "activation_peak_bytes" in row else f"{'-':>8}"
        print(f"{lead} {row['ms']:9.3f} {row['ms_per_layer']:9.3f} {row['tokens_per_s']:11.0f} {speedup} "
              f"{row['rel_err']:8.1e} {peak}")
        if "dfss_moves_output_by" in row:
            print(f"{'':48}DFSS pruning moves the output by {row['dfss_moves_output_by']:.1e} against SDPA")
    if result["max_memory_allocated"] is not None:
        print(f"\ntorch.cuda.max_memory_allocated: {result['max_memory_allocated'] / 2**30:.2f} GiB (PyTorch's "
              "allocator only; nmkit's weights are allocated outside it)")
    print("rel.err: against a dense model with the same pruned weights (out - x); act. MB: PyTorch's peak above the "
          "resident state while the row's graph was made")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, help="cached tokens a decode step attends to (1024; 32 with --tiny)")
    parser.add_argument("--rounds", type=int, help="interleaved timed rounds per workload (15; 5 with --quick, "
                        "3 on the CPU)")
    parser.add_argument("--warmup-s", type=float, help="seconds of warm-up per workload (1; 0.3 with --quick, "
                        "0 on the CPU)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="GPU time a timed sample aims at")
    parser.add_argument("--quick", action="store_true", help="prefill 8 x 512 and decode at batch 16 only; "
                        "implies --prune-once")
    parser.add_argument("--prune-once", action="store_true",
                        help="every layer holds its own copy of the first layer's weights, so that only one layer "
                        "is pruned on the CPU (the kernels' work does not depend on the values)")
    parser.add_argument("--variants", nargs="+", default=["nm24", "vnm", "vnm_fm", "tile", "torch24", "dfss", "fp8"],
                        choices=["dense", "nm24", "vnm", "vnm_fm", "tile", "torch24", "dfss", "fp8"],
                        help="besides dense, which is always timed")
    parser.add_argument("--dtype", choices=list(DTYPES), default="f16")
    parser.add_argument("--tile-density", type=float, default=0.5, help="the fraction of 64x64 tiles kept")
    parser.add_argument("--max-error", type=float, help="the largest relative error timed (2e-2; 5e-2 for bf16; 2.5 times that for fp8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="hidden 256, 4 heads of 64, FFN 688")
    parser.add_argument("--separate-projections", action="store_true",
                        help="q, k, v and gate, up as separate Linears (default: fused, as serving engines run them)")
    parser.add_argument("--glue", choices=Glue.KINDS, help="the layers' elementwise work: fused (the default on "
                        "the GPU: PyTorch's fused RMSNorm and torch.compile kernels) or eager (a kernel per step, "
                        "as Hugging Face's Llama; the default on the CPU)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    args.context = args.context or (32 if args.tiny else 1024)
    args.prune_once = args.prune_once or args.quick
    args.glue = args.glue or ("eager" if args.device == "cpu" else "fused")
    args.max_error = args.max_error or (5e-2 if args.dtype == "bf16" else 2e-2)
    args.rounds = args.rounds or (3 if args.device == "cpu" else 5 if args.quick else 15)
    if args.warmup_s is None:
        args.warmup_s = 0.0 if args.device == "cpu" else 0.3 if args.quick else 1.0
    if args.layers < 1 or args.context < 1 or args.rounds < 1:
        parser.error("--layers, --context and --rounds must be at least 1")
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    cfg = Config(**(TINY if args.tiny else LLAMA2_7B), layers=args.layers, fused=not args.separate_projections)
    if device.type == "cpu":
        torch.set_num_threads(1)
        args.variants = ["dense"]  # the others need the GPU
        log("dry run on the CPU: the dense variant only, eager")
        check_keep_24()
        fp32 = [{name: w.float() for name, w in layer.items()} for layer in random_weights(cfg, dtype, device, 4)]
        ones = [(torch.ones(cfg.hidden, device=device),) * 2 for _ in range(cfg.layers)]
        check_decode_matches_prefill(Stack(cfg, [{n: DenseLinear(w) for n, w in layer.items()} for layer in fp32],
                                           ones, Rope(cfg, 64, torch.float32, device)), cfg, torch.float32, device)
        check_pruned_references(cfg, dtype, device, args.tile_density)
    elif not torch.cuda.is_available():
        parser.error("PyTorch sees no CUDA device (--device cpu --tiny is the dry run)")
    result = bench(args, cfg, dtype, device)
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
