"""A linear layer through PyTorch, side by side in one process: dense F.linear (cuBLAS), PyTorch's 2:4 tensor
(to_sparse_semi_structured: cuSPARSELt on Hopper) and nmkit.torch.SparseLinear on the same pruned weight, and
SparseLinear on the weight pruned to each --vnm pattern instead (vnm:128:2:8 by default; checked against F.linear on
that weight; pruned once per shape, in f32, and rounded to each dtype).

    PYTHONPATH=build/gpu/python python3 bench/torch_linear.py [--json out.json] [--iters 50] [--rounds 7]
        [--shapes "11008,4096,4096;4096,4096,16"] [--vnm vnm:128:2:8,vnm:128:2:16]
    PYTHONPATH=build/gpu/python python3 bench/torch_linear.py --fp8 [--tokens 16,128] [--weights "768,768;1024,4096"]
    PYTHONPATH=build/gpu/python python3 bench/torch_linear.py --profile --shapes 11008,4096,4096 ...

--fp8 compares 8-bit layers on bf16 activations instead (FP8_SHAPES or --weights, x --tokens): F.linear in bf16;
torch._scaled_mm, dense fp8 e4m3 with a scale per output channel and x quantized per token (absmax / 448) by eager
torch ops inside the timed call, with and without fast accumulation (per-tensor scales where this PyTorch lacks
row-wise ones, the row says so); nmkit.torch.SparseLinear in bf16 2:4, and in 8-bit 2:4 (e4m3, and int8 where the
8-bit plan takes it, else "int8: not built"), x quantized per token inside the call. Each 8-bit row is checked
against its own quantized product in fp32 (x quantized per token, the weight dequantized: `rel.err q`, under 2e-2
or the row is not timed), and every row against the fp32 product of the pruned weight (`rel.err`: what 8 bits cost).

Per shape and library: the GPU time of a call (CUDA events around `iters` back-to-back calls, median over
interleaved rounds, the order rotating) and the host time to issue one (wall clock of the same loop before it
synchronises). Where the host time exceeds the GPU time, the loop is host-bound and the event time is the host's.
Then the same `iters` calls captured in one CUDA graph and replayed ("graph ms" per call): the kernels' own time,
with no host cost, where a library's call can be captured.
Each library's calls rotate through copies of its weight whose bytes (the smallest library's) exceed 3x L2, as a
model's layers each read their weight once per step: one weight called again and again stays in L2 (a 4096x4096
bf16 weight is 32 MB, the H200's L2 60 MB), which no model sees and which favours the dense weight at few tokens.
Each library's output is checked against F.linear on the pruned weight in fp32 first.
--profile also lists, per library, the kernels one call runs and each one's GPU time per call (torch.profiler over
`iters` calls after the rounds): where a layer's time goes beyond its product (a transpose, a copy, a quantizer).
"""
import argparse
import itertools
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

import nmkit
import nmkit.torch as nmt

SHAPES = [  # (R, K, T): out_features, in_features, tokens
    (4096, 4096, 16),      # decode-sized: the call's fixed cost shows
    (11008, 4096, 16),
    (1024, 4096, 512),     # BERT-large at a short batch
    (1024, 4096, 4096),
    (11008, 4096, 4096),   # LLaMA-7B up-projection
    (4096, 11008, 4096),
]


def time_loop(call, iters):
    """(GPU ms per call, host us per call) of `iters` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    host = time.perf_counter() - t0
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters, host / iters * 1e6


def capture(call, iters):
    """`iters` calls captured in one CUDA graph (after a warm-up on a side stream), or why they could not be."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                call()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception as e:  # noqa: BLE001 - reported in the table
        torch.cuda.synchronize()
        return f"{type(e).__name__}: {e}"


def copies_beyond_l2(smallest_weight_bytes):
    """How many copies of a layer's weight a timed loop rotates through: enough that the smallest library's copies
    hold at least 3x the L2 cache, so that no call finds its weight there."""
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, math.ceil(3 * l2_bytes / smallest_weight_bytes))


def rotating(calls):
    """One callable making calls[0], calls[1], ... in turn (a CUDA graph captures the turns it was made with)."""
    turns = itertools.cycle(calls)
    return lambda: next(turns)()


def relative_error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def measure(libraries, iters, rounds, warmup_s):
    """Each library's (GPU ms, host us) per interleaved round, its graph (or why it could not be captured) and the
    graph replays' ms per call, after a warm-up to settled clocks."""
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        for call in libraries.values():
            time_loop(call, 4)
    samples = {name: [] for name in libraries}
    names = list(libraries)
    graphs = {name: capture(call, iters) for name, call in libraries.items()}
    replays = {name: [] for name, g in graphs.items() if not isinstance(g, str)}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(time_loop(libraries[name], iters))
            if name in replays:
                replays[name].append(time_loop(graphs[name].replay, 1)[0] / iters)
    return samples, graphs, replays


def kernel_breakdown(call, iters):
    """[(kernel, GPU us per call)] of the kernels (and copies) `iters` calls run, the longest first."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us > 0:
            rows.append((e.key, us / iters))
    return sorted(rows, key=lambda r: -r[1])


def summarise(samples, graphs, replays, checked, baseline):
    """Per library: medians, the speed-up over `baseline` and the check's errors."""
    out = {}
    dense_ms = statistics.median(s[0] for s in samples[baseline])
    for name, runs in samples.items():
        gpu_ms = statistics.median(s[0] for s in runs)
        graph_ms = statistics.median(replays[name]) if name in replays else None
        out[name] = {"gpu_ms": gpu_ms, "host_us": statistics.median(s[1] for s in runs),
                     "speedup_vs_dense": dense_ms / gpu_ms, "graph_ms": graph_ms,
                     "graph_error": graphs[name] if graph_ms is None else None, **checked[name]}
    return out


VNM_PATTERNS = ["vnm:128:2:8"]
_vnm_pruned = {}  # (R, K, pattern): the V:N:M weight in f32, pruned once (its CPU column search takes seconds)


def vnm_kept_fraction(pattern):
    """The fraction of a weight's values a V:N:M pattern keeps: N of M."""
    _, _, n, m = pattern.split(":")
    return int(n) / int(m)


def bench_shape(rows, cols, tokens, dtype, iters, rounds, warmup_s, vnm_patterns=VNM_PATTERNS, profile=False):
    torch.manual_seed(0)
    dense = torch.nn.Linear(cols, rows, bias=False, device="cuda", dtype=dtype)
    storage = "f16" if dtype == torch.float16 else "bf16"
    w = dense.weight.detach().float().cpu().numpy()
    w16 = nmkit.prune(w, "2:4", storage)
    pruned = torch.from_numpy(w16.to_dense()).to("cuda", dtype)
    copies = copies_beyond_l2(rows * cols * pruned.element_size() // 2)  # the 2:4 values
    pruned_copies = [pruned] + [pruned.clone() for _ in range(copies - 1)]
    layers = [nmt.SparseLinear(w16, device="cuda") for _ in range(copies)]
    layer = layers[0]
    x = torch.randn(tokens, cols, device="cuda", dtype=dtype)
    # The same x feature-major (x^T contiguous, a [T, K] view): what a layer with feature_major_output hands the
    # next one through elementwise ops, read without a transpose.
    x_features = x.t().contiguous().t()
    want = F.linear(x.float(), pruned.float())
    libraries = {"cuBLAS (F.linear)": rotating([lambda w=w: F.linear(x, w) for w in pruned_copies]),
                 "nmkit SparseLinear": rotating([lambda layer=layer: layer(x) for layer in layers]),
                 "nmkit SparseLinear, x feature-major": rotating([lambda layer=layer: layer(x_features)
                                                                  for layer in layers])}
    references = {name: want for name in libraries}
    errors = {}
    vnm_layers = {}  # pattern: the layer's weight copies
    for pattern in vnm_patterns:
        name = f"nmkit SparseLinear {pattern}"
        try:
            if (rows, cols, pattern) not in _vnm_pruned:
                _vnm_pruned[(rows, cols, pattern)] = nmkit.prune(w, pattern, "f32")
            wv = _vnm_pruned[(rows, cols, pattern)].astype(storage)
            kept_bytes = int(rows * cols * pruned.element_size() * vnm_kept_fraction(pattern))
            vnm_layers[pattern] = [nmt.SparseLinear(wv, device="cuda") for _ in range(copies_beyond_l2(kept_bytes))]
            libraries[name] = rotating([lambda layer=layer: layer(x) for layer in vnm_layers[pattern]])
            references[name] = F.linear(x.float(), torch.from_numpy(wv.to_dense()).to("cuda"))
            libraries[f"{name}, x feature-major"] = rotating([lambda layer=layer: layer(x_features)
                                                              for layer in vnm_layers[pattern]])
            references[f"{name}, x feature-major"] = references[name]
        except Exception as e:  # noqa: BLE001 - reported in the table
            errors[name] = f"{type(e).__name__}: {e}"
    try:
        # cuSPARSELt explicitly: PyTorch's default CUTLASS backend refuses Hopper.
        semis = [torch.sparse.SparseSemiStructuredTensorCUSPARSELT.from_dense(w) for w in pruned_copies]
        libraries["torch 2:4 (semi-structured)"] = rotating([lambda semi=semi: F.linear(x, semi) for semi in semis])
        references["torch 2:4 (semi-structured)"] = want
    except Exception as e:  # noqa: BLE001 - the baseline is optional; say why it is missing
        errors["torch 2:4 (semi-structured)"] = f"{type(e).__name__}: {e}"
    checked = {}
    with torch.no_grad():
        for name, call in list(libraries.items()):
            try:
                checked[name] = relative_error(call(), references[name])
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {e}"
                del libraries[name]
        # Warm up to the clocks sustained load runs at, all libraries in turn; then the interleaved rounds.
        samples, graphs, replays = measure(libraries, iters, rounds, warmup_s)
        kernels = {name: kernel_breakdown(call, iters) for name, call in libraries.items()} if profile else None
    result = {"shape": [rows, cols, tokens], "dtype": str(dtype).split(".")[1], "errors": errors,
              "baseline": "cuBLAS (F.linear)", "weight_copies": copies}
    if kernels:
        result["kernels_us_per_call"] = kernels
    result["libraries"] = summarise(samples, graphs, replays, {n: {"rel_err": e} for n, e in checked.items()},
                                    result["baseline"])
    result["nmkit_kernel"] = layer.kernel(tokens)
    result["nmkit_kernel_x_feature_major"] = layer.kernel(tokens, feature_major_x=True)
    for pattern, copies_of_layer in vnm_layers.items():
        result[f"nmkit_kernel_{pattern}"] = copies_of_layer[0].kernel(tokens)
        result[f"nmkit_kernel_{pattern}_x_feature_major"] = copies_of_layer[0].kernel(tokens, feature_major_x=True)
    return result


FP8_SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008)]  # (R, K): out_features, in_features
E4M3_MAX = 448.0
CHECK_8BIT = 2e-2  # a row's error against its reference (an 8-bit row's own quantized product): 2x the bf16 tests'



def quantize_per_token(x, type):
    """x [T, K] quantized per token (scale = absmax / the type's largest value, round to nearest even), dequantized
    in fp32: the 8-bit rows' reference (python/tests/test_torch.py checks the same rule against nmkit's)."""
    largest = {"e4m3": E4M3_MAX, "int8": 127.0}[type]
    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True) / largest
    v = x / torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(v).clamp(-127, 127) if type == "int8" else v.to(torch.float8_e4m3fn).float()
    return codes * scale


def scaled_mm_fp8(w, rowwise):
    """torch._scaled_mm on an e4m3 copy of w [R, K] (a scale per output channel, or one per tensor): returns
    (make_call(x, fast_accum), w dequantized [R, K] fp32) where the call quantizes x [T, K] by the same absmax rule
    (per token, or per tensor) and multiplies, out bf16."""
    w = w.float()
    w_scale = (w.abs().amax(dim=1, keepdim=True) if rowwise else w.abs().amax()) / E4M3_MAX
    w8 = (w / w_scale.clamp_min(torch.finfo(torch.float32).tiny)).to(torch.float8_e4m3fn)
    scale_b = w_scale.view(1, -1) if rowwise else w_scale.view(())
    tiny = torch.finfo(torch.float32).tiny

    def make_call(x, fast_accum):
        def call():
            scale_a = (x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()).float() / E4M3_MAX
            x8 = (x.float() / scale_a.clamp_min(tiny)).to(torch.float8_e4m3fn)
            return torch._scaled_mm(x8, w8.t(), scale_a=scale_a if rowwise else scale_a.view(()), scale_b=scale_b,
                                    out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
        return call

    return make_call, w8.float() * w_scale


def quantized_reference_of_scaled_mm(x, w_deq, rowwise):
    """What scaled_mm_fp8's call computes, in fp32: x quantized (per token or per tensor) times w dequantized."""
    if rowwise:
        return F.linear(quantize_per_token(x, "e4m3"), w_deq)
    scale = x.float().abs().amax() / E4M3_MAX
    x_deq = (x.float() / scale.clamp_min(torch.finfo(torch.float32).tiny)).to(torch.float8_e4m3fn).float() * scale
    return F.linear(x_deq, w_deq)


def bench_fp8_weight(rows, cols, token_counts, iters, rounds, warmup_s):
    """The 8-bit comparison of one R x K weight at each token count (the layers made once)."""
    dtype = torch.bfloat16
    torch.manual_seed(0)
    dense = torch.nn.Linear(cols, rows, bias=False, device="cuda", dtype=dtype)
    w = dense.weight.detach().float().cpu().numpy()
    w16 = nmkit.prune(w, "2:4", "bf16")
    pruned = torch.from_numpy(w16.to_dense()).to("cuda", dtype)
    copies = copies_beyond_l2(rows * cols // 2)  # the 8-bit 2:4 values
    pruned_copies = [pruned] + [pruned.clone() for _ in range(copies - 1)]
    nm16 = [nmt.SparseLinear(w16, device="cuda") for _ in range(copies)]
    layers, errors = {}, {}  # name: (code, its copies, the weight dequantized)
    for code, name in (("e4m3", "nmkit 2:4 fp8 e4m3 (x quantized)"), ("int8", "nmkit 2:4 int8 (x quantized)")):
        try:
            q = nmkit.prune(w, "2:4", dtype=code)
            layers[name] = (code, [nmt.SparseLinear(q, dtype=dtype, device="cuda") for _ in range(copies)],
                            torch.from_numpy(q.to_dense()).to("cuda"))
        except (NotImplementedError, RuntimeError) as e:  # the 8-bit plan without this type's kernel
            errors[name] = f"{code}: not built ({e})"
    results = []
    for tokens in token_counts:
        x = torch.randn(tokens, cols, device="cuda", dtype=dtype)
        want = F.linear(x.float(), pruned.float())
        libraries = {"F.linear bf16 (cuBLAS)": rotating([lambda w=w: F.linear(x, w) for w in pruned_copies]),
                     "nmkit 2:4 bf16": rotating([lambda layer=layer: layer(x) for layer in nm16])}
        references = {}  # an 8-bit row's own quantized product
        row_errors = dict(errors)
        for rowwise in (True, False):
            try:
                make_call, w_deq = scaled_mm_fp8(pruned, rowwise)
                make_call(x, False)()  # does this PyTorch take these scales?
                makers = [make_call] + [scaled_mm_fp8(w, rowwise)[0] for w in pruned_copies[1:]]
            except RuntimeError as e:
                row_errors[f"torch._scaled_mm ({'row-wise' if rowwise else 'per-tensor'} scales)"] = str(e)
                continue
            what = "per-channel x per-token" if rowwise else "per-tensor scales"
            reference_q = quantized_reference_of_scaled_mm(x, w_deq, rowwise)
            for fast in (True, False):
                name = f"torch._scaled_mm fp8 {what}{', fast acc' if fast else ''}"
                libraries[name] = rotating([make(x, fast) for make in makers])
                references[name] = reference_q
            break
        for name, (code, copies_of_layer, w_deq) in layers.items():
            libraries[name] = rotating([lambda layer=layer: layer(x) for layer in copies_of_layer])
            references[name] = F.linear(quantize_per_token(x, code), w_deq)
        checked = {}
        with torch.no_grad():
            for name, call in list(libraries.items()):
                try:
                    got = call()
                    checked[name] = {"rel_err": relative_error(got, want)}
                    if name in references:
                        checked[name]["rel_err_q"] = relative_error(got, references[name])
                    error = checked[name].get("rel_err_q", checked[name]["rel_err"])
                    if not error < CHECK_8BIT:
                        raise AssertionError(f"wrong result: relative error {error:.2e} against its reference "
                                             f"(> {CHECK_8BIT})")
                except Exception as e:  # noqa: BLE001 - reported in the table, the row not timed
                    row_errors[name] = f"{type(e).__name__}: {e}"
                    del libraries[name]
            samples, graphs, replays = measure(libraries, iters, rounds, warmup_s)
        result = {"shape": [rows, cols, tokens], "dtype": "bf16", "errors": row_errors,
                  "baseline": "F.linear bf16 (cuBLAS)", "weight_copies": copies}
        result["libraries"] = summarise(samples, graphs, replays, checked, result["baseline"])
        result["nmkit_kernel"] = {name: layer_copies[0].kernel(tokens) for name, (_, layer_copies, _) in layers.items()}
        results.append(result)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--iters", type=int, default=50, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per library")
    parser.add_argument("--warmup-s", type=float, default=0.3, help="seconds of warm-up per shape")
    parser.add_argument("--dtype", choices=["f16", "bf16", "both"], default="both")
    parser.add_argument("--fp8", action="store_true", help="the 8-bit comparison (bf16 activations) instead")
    parser.add_argument("--tokens", default="16,128,512,2048,4096", help="--fp8: token counts, comma-separated")
    parser.add_argument("--shapes", help="R,K,T triples separated by ';' instead of the default shapes")
    parser.add_argument("--weights", help="--fp8: R,K pairs separated by ';' instead of FP8_SHAPES")
    parser.add_argument("--vnm", default=",".join(VNM_PATTERNS),
                        help="V:N:M patterns timed beside 2:4, comma-separated (empty: none)")
    parser.add_argument("--profile", action="store_true",
                        help="also list the kernels of each library's call and their GPU time (torch.profiler)")
    args = parser.parse_args()
    dtypes = {"f16": [torch.float16], "bf16": [torch.bfloat16], "both": [torch.float16, torch.bfloat16]}[args.dtype]
    results = []
    width = 48
    print(f"{'shape RxKxT':22} {'dtype':8} {'library':{width}} {'GPU ms':>9} {'host us':>8} {'x dense':>8} "
          f"{'rel.err':>8} {'graph ms':>9} {'x dense':>8}" + (f" {'rel.err q':>9}" if args.fp8 else ""))

    def save():
        # After every row, so that a run cut short (a device call's time limit) keeps the rows it finished.
        if args.json:
            with open(args.json + ".part", "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "mode": "fp8" if args.fp8 else "16-bit", "results": results}, f, indent=1)
            os.replace(args.json + ".part", args.json)  # a run killed mid-write keeps the last whole file

    def report(r):
        rows, cols, tokens = r["shape"]
        dense_graph = r["libraries"][r["baseline"]]["graph_ms"]
        for name, lib in r["libraries"].items():
            graph = (f"{lib['graph_ms']:9.4f} {dense_graph / lib['graph_ms']:7.2f}x" if lib["graph_ms"] and dense_graph
                     else f"{'n/a':>9} {'':8}")
            quantized = f" {lib['rel_err_q']:9.1e}" if "rel_err_q" in lib else ""
            print(f"{rows}x{cols}x{tokens:<9} {r['dtype']:8} {name:{width}} {lib['gpu_ms']:9.4f} {lib['host_us']:8.1f} "
                  f"{lib['speedup_vs_dense']:7.2f}x {lib['rel_err']:8.1e} {graph}{quantized}")
            if lib["graph_error"]:
                print(f"{'':41}{name} not captured: {lib['graph_error'][:100]}")
        for name, why in r["errors"].items():
            print(f"{rows}x{cols}x{tokens:<9} {r['dtype']:8} {name:{width}} not timed: {why[:120]}")
        for name, kernels in r.get("kernels_us_per_call", {}).items():
            print(f"  {name}: " + "; ".join(f"{us:.1f} us {kernel[:100]}" for kernel, us in kernels))

    if args.fp8:
        token_counts = [int(t) for t in args.tokens.split(",")]
        weights = ([tuple(int(v) for v in pair.split(",")) for pair in args.weights.split(";")] if args.weights
                   else FP8_SHAPES)
        if any(len(weight) != 2 for weight in weights):
            parser.error(f"--weights wants R,K pairs separated by ';', got {args.weights!r}")
        for rows, cols in weights:
            for r in bench_fp8_weight(rows, cols, token_counts, args.iters, args.rounds, args.warmup_s):
                results.append(r)
                report(r)
                save()
    else:
        shapes = ([tuple(int(v) for v in triple.split(",")) for triple in args.shapes.split(";")] if args.shapes
                  else SHAPES)
        if any(len(shape) != 3 for shape in shapes):
            parser.error(f"--shapes wants R,K,T triples separated by ';', got {args.shapes!r}")
        vnm_patterns = [p for p in args.vnm.split(",") if p]
        for dtype in dtypes:
            for rows, cols, tokens in shapes:
                results.append(bench_shape(rows, cols, tokens, dtype, args.iters, args.rounds, args.warmup_s,
                                           vnm_patterns, args.profile))
                report(results[-1])
                save()


if __name__ == "__main__":
    main()
