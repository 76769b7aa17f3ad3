"""The attention suite: nmkit's fused DFSS attention against PyTorch's SDPA, side by side in one process.

    PYTHONPATH=build/gpu/python python3 bench/torch_attention.py [--json out.json] [--quick] [--dtype f16]
        [--seq 1024 4096] [--head-dim 128] [--causal both|on|off] [--iters 30]

Per row (sequence length S, head dim d, causal or not): q, k, v [B, H, S, d] with B * S = --tokens (16384) and H =
--heads (32), so B * H * S is the same in every row; contenders SDPA on its flash backend, SDPA on its cuDNN backend
(torch.nn.attention.sdpa_kernel; a backend that raises is reported and skipped), nmkit dense (the fused kernel with
pruning off) and nmkit 2:4 (DFSS). Each contender's output is checked first: SDPA cuDNN and nmkit dense against SDPA
flash, nmkit 2:4 against nmkit dense (how far pruning moves O; not an error). Then a warm-up of --warmup-s seconds
with every contender in turn, then --iters rounds; in each round every contender runs once between two CUDA events,
the order rotating from round to round, and its time is the median over the rounds. TFLOP/s count the dense work,
4 * B * H * S^2 * d, halved under causal, for every contender alike. The ratios are speed-ups (time over time):
2:4 against the faster SDPA backend and against nmkit dense.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import nmkit
    import nmkit.torch as nmt
    WHY_NO_NMKIT = None
except ImportError as e:  # the SDPA rows still run
    WHY_NO_NMKIT = f"nmkit is not importable ({e})"

SDPA = {"SDPA flash": SDPBackend.FLASH_ATTENTION, "SDPA cuDNN": SDPBackend.CUDNN_ATTENTION}
NMKIT = {"nmkit dense": "dense", "nmkit 2:4": "2:4"}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def contenders(q, k, v, causal):
    """{name: a call} for every contender, and {name: why not} for those that cannot run here."""
    calls, errors = {}, {}
    for name, backend in SDPA.items():
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        calls[name] = sdpa
    for name, pattern in NMKIT.items():
        if WHY_NO_NMKIT:
            errors[name] = WHY_NO_NMKIT
        else:
            calls[name] = lambda pattern=pattern: nmt.dfss_attention(q, k, v, causal=causal, pattern=pattern)
    return calls, errors


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def time_call(call):
    """GPU milliseconds of one call, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench_row(seq, head_dim, causal, dtype, args):
    batch, heads = max(1, args.tokens // seq), args.heads
    torch.manual_seed(seq + head_dim)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(3))
    calls, errors = contenders(q, k, v, causal)
    outputs = {}
    with torch.no_grad():
        for name, call in list(calls.items()):
            try:
                outputs[name] = call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape is reported, not timed
                torch.cuda.synchronize()
                errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                del calls[name]
        checks = {}
        for name, against in (("SDPA cuDNN", "SDPA flash"), ("nmkit dense", "SDPA flash"),
                              ("nmkit 2:4", "nmkit dense")):
            if name in outputs and against in outputs:
                checks[name] = (against, relative_error(outputs[name], outputs[against]))
        del outputs
        deadline = time.perf_counter() + args.warmup_s  # to the clocks that sustained load settles to
        while calls and time.perf_counter() < deadline:
            for call in calls.values():
                call()
            torch.cuda.synchronize()
        names, samples = list(calls), {name: [] for name in calls}
        for r in range(args.iters):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name].append(time_call(calls[name]))
    flops = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    row = {"seq": seq, "head_dim": head_dim, "causal": causal, "batch": batch, "heads": heads,
           "dtype": str(dtype).split(".")[1], "flops": flops, "errors": errors, "contenders": {}}
    for name, times in samples.items():
        ms = statistics.median(times)
        row["contenders"][name] = {"ms": ms, "tflops": flops / ms / 1e9, "min_ms": min(times),
                                   "check": checks.get(name)}
    timed = row["contenders"]
    best_sdpa = min((timed[n]["ms"] for n in SDPA if n in timed), default=None)
    sparse = timed.get("nmkit 2:4", {}).get("ms")
    row["speedup_vs_best_sdpa"] = best_sdpa / sparse if sparse and best_sdpa else None
    row["speedup_vs_nmkit_dense"] = timed["nmkit dense"]["ms"] / sparse if sparse and "nmkit dense" in timed else None
    return row


def cell(row, name):
    c = row["contenders"].get(name)
    return f"{c['ms']:8.3f} {c['tflops']:6.1f}" if c else f"{'-':>8} {'-':>6}"


def ratio(x):
    return f"{x:6.2f}x" if x else f"{'-':>7}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    parser.add_argument("--causal", choices=["both", "on", "off"], default="both")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--iters", type=int, default=30, help="timed rounds (each contender once per round)")
    parser.add_argument("--warmup-s", type=float, default=0.5, help="seconds of warm-up per row")
    parser.add_argument("--tokens", type=int, default=16384, help="B * S of every row")
    parser.add_argument("--heads", type=int, default=32, help="H of every row")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="S 1024 and 4096, d 128, 10 rounds")
    args = parser.parse_args()
    if args.quick:
        args.seq, args.head_dim, args.iters, args.warmup_s = [1024, 4096], [128], 10, 0.2
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    dtype = DTYPES[args.dtype]
    causals = {"both": [False, True], "on": [True], "off": [False]}[args.causal]
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}, {args.dtype}, B*S = {args.tokens}, H = {args.heads}; "
          f"ms and TFLOP/s (dense FLOPs) per contender, medians of {args.iters} rounds")
    if WHY_NO_NMKIT:
        print(f"nmkit rows skipped: {WHY_NO_NMKIT}")
    header = f"{'S':>6} {'d':>4} {'causal':>6} {'B':>3} " + " ".join(f"{n:>15}" for n in (*SDPA, *NMKIT))
    print(header + f" {'2:4/SDPA':>8} {'2:4/dense':>9}")
    rows = []
    for head_dim in args.head_dim:
        for causal in causals:
            for seq in args.seq:
                row = bench_row(seq, head_dim, causal, dtype, args)
                rows.append(row)
                print(f"{seq:6d} {head_dim:4d} {str(causal):>6} {row['batch']:3d} "
                      + " ".join(cell(row, n) for n in (*SDPA, *NMKIT))
                      + f" {ratio(row['speedup_vs_best_sdpa']):>8} {ratio(row['speedup_vs_nmkit_dense']):>9}")
                for name, why in row["errors"].items():
                    if why != WHY_NO_NMKIT:
                        print(f"{'':22}{name} not timed: {why[:150]}")
    print("\nchecks (relative Frobenius difference of O):")
    for row in rows:
        parts = [f"{n} vs {c['check'][0]} {c['check'][1]:.1e}" for n, c in row["contenders"].items() if c["check"]]
        if parts:
            print(f"  S={row['seq']} d={row['head_dim']} causal={row['causal']}: " + "; ".join(parts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": "attention", "device": device, "torch": torch.__version__,
                       "nmkit": None if WHY_NO_NMKIT else nmkit.build_info(), "args": vars(args), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
