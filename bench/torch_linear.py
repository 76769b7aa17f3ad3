"""A linear layer through PyTorch, side by side in one process: dense F.linear (cuBLAS), PyTorch's 2:4 tensor
(to_sparse_semi_structured: cuSPARSELt on Hopper) and nmkit.torch.SparseLinear on the same pruned weight.

    PYTHONPATH=build/gpu/python python3 bench/torch_linear.py [--json out.json] [--iters 50] [--rounds 7]

Per shape and library: the GPU time of a call (CUDA events around `iters` back-to-back calls, median over
interleaved rounds, the order rotating) and the host time to issue one (wall clock of the same loop before it
synchronises). Where the host time exceeds the GPU time, the loop is host-bound and the event time is the host's.
Then the same `iters` calls captured in one CUDA graph and replayed ("graph ms" per call): the kernels' own time,
with no host cost, where a library's call can be captured.
Each library's output is checked against F.linear on the pruned weight in fp32 first.
"""
import argparse
import json
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


def relative_error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def bench_shape(rows, cols, tokens, dtype, iters, rounds, warmup_s):
    torch.manual_seed(0)
    dense = torch.nn.Linear(cols, rows, bias=False, device="cuda", dtype=dtype)
    layer = nmt.SparseLinear.from_linear(dense, "2:4")
    pruned = torch.from_numpy(nmkit.prune(dense.weight.detach().float().cpu().numpy(), "2:4",
                                          "f16" if dtype == torch.float16 else "bf16").to_dense()).to("cuda", dtype)
    x = torch.randn(tokens, cols, device="cuda", dtype=dtype)
    want = F.linear(x.float(), pruned.float())
    libraries = {"cuBLAS (F.linear)": lambda: F.linear(x, pruned), "nmkit SparseLinear": lambda: layer(x)}
    errors = {}
    try:
        # cuSPARSELt explicitly: PyTorch's default CUTLASS backend refuses Hopper.
        semi = torch.sparse.SparseSemiStructuredTensorCUSPARSELT.from_dense(pruned)
        libraries["torch 2:4 (semi-structured)"] = lambda: F.linear(x, semi)
    except Exception as e:  # noqa: BLE001 - the baseline is optional; say why it is missing
        errors["torch 2:4 (semi-structured)"] = f"{type(e).__name__}: {e}"
    checked = {}
    with torch.no_grad():
        for name, call in list(libraries.items()):
            try:
                checked[name] = relative_error(call(), want)
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {e}"
                del libraries[name]
        # Warm up to the clocks sustained load runs at, all libraries in turn.
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
    result = {"shape": [rows, cols, tokens], "dtype": str(dtype).split(".")[1], "errors": errors, "libraries": {}}
    dense_ms = statistics.median(s[0] for s in samples["cuBLAS (F.linear)"])
    for name, runs in samples.items():
        gpu_ms = statistics.median(s[0] for s in runs)
        graph_ms = statistics.median(replays[name]) if name in replays else None
        result["libraries"][name] = {"gpu_ms": gpu_ms, "host_us": statistics.median(s[1] for s in runs),
                                     "speedup_vs_dense": dense_ms / gpu_ms, "rel_err": checked[name],
                                     "graph_ms": graph_ms, "graph_error": graphs[name] if graph_ms is None else None}
    result["nmkit_kernel"] = layer.kernel(tokens)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--iters", type=int, default=50, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per library")
    parser.add_argument("--warmup-s", type=float, default=0.3, help="seconds of warm-up per shape")
    parser.add_argument("--dtype", choices=["f16", "bf16", "both"], default="both")
    args = parser.parse_args()
    dtypes = {"f16": [torch.float16], "bf16": [torch.bfloat16], "both": [torch.float16, torch.bfloat16]}[args.dtype]
    results = []
    print(f"{'shape RxKxT':22} {'dtype':8} {'library':30} {'GPU ms':>9} {'host us':>8} {'x dense':>8} {'rel.err':>8} "
          f"{'graph ms':>9} {'x dense':>8}")
    for dtype in dtypes:
        for rows, cols, tokens in SHAPES:
            r = bench_shape(rows, cols, tokens, dtype, args.iters, args.rounds, args.warmup_s)
            results.append(r)
            dense_graph = r["libraries"]["cuBLAS (F.linear)"]["graph_ms"]
            for name, lib in r["libraries"].items():
                graph = (f"{lib['graph_ms']:9.4f} {dense_graph / lib['graph_ms']:7.2f}x" if lib["graph_ms"] and dense_graph
                         else f"{'n/a':>9} {'':8}")
                print(f"{rows}x{cols}x{tokens:<9} {r['dtype']:8} {name:30} {lib['gpu_ms']:9.4f} {lib['host_us']:8.1f} "
                      f"{lib['speedup_vs_dense']:7.2f}x {lib['rel_err']:8.1e} {graph}")
                if lib["graph_error"]:
                    print(f"{'':41}{name} not captured: {lib['graph_error'][:100]}")
            for name, why in r["errors"].items():
                print(f"{rows}x{cols}x{tokens:<9} {r['dtype']:8} {name:30} not timed: {why[:120]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
