"""Where nmkit.torch.prune_model's time goes on a Llama-2-7B-shaped model (issue 40: OBS over all 32 blocks of a 7B
model, 128 calibration sequences of 2048 tokens, in <= 15 minutes on the GPU machine).

    PYTHONPATH=build/pcpu/python python3 bench/prune_model_time.py --json $OUT/prune_model_time.json \
        [--blocks 3] [--sequences 128] [--seq-len 2048] [--method obs wanda magnitude] [--format 2:4]
    PYTHONPATH=build/default/python:.deps/py:.deps/torch OMP_NUM_THREADS=1 python3 bench/prune_model_time.py \
        --device cpu --tiny                                  # the dry run, no GPU: every step on small shapes

prune_model itself needs only nmkit's CPU extension (the solvers), so on the GPU machine a CPU-only build of the
`_nmkit` target is enough (no CUDA kernels to compile; RE2 comes from .deps/re2, which the call carries and
scripts/carry_re2.sh makes, as scripts/gpu_env.sh says); one device command (about 1 minute of build, then 2-4
minutes by the estimate below):
    source scripts/gpu_env.sh && cmake -S . -B build/pcpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DNMKIT_ENABLE_CUDA=OFF -DNMKIT_BUILD_PYTHON=ON -DNMKIT_BUILD_TESTS=OFF -DNMKIT_BUILD_TOOLS=OFF \
        -DNMKIT_DEFAULT_MODEL=/model-not-carried >$OUT/configure.log 2>&1 && \
    cmake --build build/pcpu --target _nmkit >$OUT/build.log 2>&1 && \
    OMP_NUM_THREADS=$(nproc) PYTHONPATH=build/pcpu/python python3 bench/prune_model_time.py \
        --method obs wanda magnitude --json $OUT/prune_model_time.json 2>&1 | tee $OUT/prune_model_time.txt
The JSON is rewritten after each method, so a call cut short keeps the methods that finished.

The model: --blocks decoder layers of Llama's architecture at Llama-2-7B's shapes (hidden 4096, 32 heads of 128,
SwiGLU FFN 11008, RMSNorm, rotary embeddings, causal SDPA; bench/torch_e2e.py's layer code, imported: each block is
an nn.Module whose seven nn.Linear layers (q, k, v, o 4096x4096, gate, up 11008x4096, down 4096x11008, no bias) run
through torch_e2e's Stack.prefill), in a ModuleList named `layers` that prune_model finds; seeded random weights of
std K^-1/2 in --dtype (f16 on the GPU). No embedding: each calibration batch is a hidden-state tensor
[--batch, --seq-len, 4096] fed to the first block, --sequences sequences in all, random normal. Random data gives
the same work as real data (the shapes and token counts set it; the solvers take no data-dependent shortcuts), not
the same pruned model: this measures time only.

What is timed: prune_model(model, batches, --format, method=...) runs unchanged; its progress callback (with
torch.cuda.synchronize before each clock read) marks its stages, and the benchmark replaces the `_nmkit` that
nmkit/prune_model.py calls by a proxy that clocks each prune_with_statistics call (the C++ solver). Per block:
  * fwd + X^T X: the calibration forward through the block with prune_model's hooks summing each Linear's X^T X in
    fp32 (GPU); "of which X^T X" is that minus a plain forward of a block over the same batches (timed after
    prune_model, no hooks);
  * to host: per Linear, from its stage's start to the solver call: the weight (as fp32) and X^T X copied to the host;
  * solve: with --solver torch (auto's choice for OBS into N:M on a CUDA device) prune_model's float64 OBS in
    PyTorch on the device, clocked until the device is done; otherwise the C++ call (prune_obs / prune_wanda /
    prune_magnitude on the CPU, OpenMP + BLAS/LAPACK in double;
    for OBS the model's GFLOP/s: 2/3 K^3 for the damped inverse Hessian's factor (potrf and trtri of the reversed
    Hessian) plus R K^2 for the lazy-block sweep);
  * write-back: from the solver's return to the next stage: to_dense, the copy into the Linear on the device
    (after prune_model, its parts are timed again for one Linear of each shape: to_dense, torch.from_numpy,
    .to(device, dtype), copy_);
  * re-run: the pruned block's forward over the batches, whose outputs are the next block's inputs (none after the
    last block);
  * the capture of the first block's inputs (once), the time before prune_model's first stage (argument checks,
    every weight's finiteness) and after its last (restoring the model's mode): with the blocks they tile
    prune_model's wall time, clocked around the call; the script exits non-zero when the parts do not sum to it or
    when the solver calls it clocked are not one per pruned Linear.
The extrapolation to 32 blocks: capture + 32 x (fwd + X^T X + the Linears) + 31 x re-run, each per-block part the
mean over the blocks after the first (the first carries one-time start-up) or over all when there is one.
Also printed: threads (OMP_NUM_THREADS, set to the cores this process may use unless given; OPENBLAS_NUM_THREADS
the same unless given; torch.get_num_threads(); os.cpu_count()), peak host RSS and torch.cuda.max_memory_allocated,
and a check that each pruned Linear's weight is 2:4 (any N:M: at most N non-zeros per group of M).

The CPU-side estimate (not a GPU-machine measurement; development machine, AMD EPYC, one thread, this extension,
X^T X of random Gaussian inputs of K + 1024 tokens; the machine is shared, so +-15 %):
prune_with_statistics(method="obs", "2:4") took 4.15 s at 4096x4096, 11.2 s at 11008x4096 (gate, up) and 33.1 s at
4096x11008 (down; 22.7 s on two threads). One 7B block's seven solves: 4 x 4.15 + 2 x 11.2 + 33.1 = 72 s on one
thread, about 2.3 TFLOP of double-precision work, most of it in OpenBLAS's dgemm (the sweep's lazy-block products)
and the factor of down's 11008 x 11008 inverse Hessian (0.89 of its 1.38 TFLOP). On 16 cores that is 4.5 s at
perfect scaling; at 45-65 % parallel efficiency 7-10 s per block, 4-5.5 minutes of solver time for 32 blocks, if
a core of the GPU machine is as fast as this one. The GPU side should be a few seconds per block: X^T X in fp32
for 262144 tokens is 90 TFLOP per block (q/k/v and gate/up share their inputs' products; TF32 tensor cores, exact
for f16 inputs: ~0.2 s on an H200), the fp16 forward 0.83 TFLOP per sequence (~0.2 s for 128), the transfers at
most 485 MB per Linear (down's X^T X). With ~1 s per block of GPU work, the 32 blocks should take 5-6 minutes in
all with the C++ solver, under the 15 of issue 40; the torch solver (--solver torch) should take less.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import sys
import time

# The solver's OpenMP and OpenBLAS read these when they load (with nmkit / torch below): all the cores, unless set.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
os.environ.setdefault("OMP_NUM_THREADS", str(_CORES))
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np  # noqa: E402
import torch  # noqa: E402

import nmkit.torch  # noqa: E402
from torch_e2e import LLAMA2_7B, TINY, Config, Rope, Stack, random_weights  # noqa: E402

PRUNE_MODULE = sys.modules["nmkit.prune_model"]  # the module whose `_nmkit` the proxy replaces
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
BLOCKS_OF_7B = 32
START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f} s] {message}", flush=True)


# The model: torch_e2e's decoder layer, its linears as nn.Linear modules so that prune_model finds and hooks them.

class DecoderBlock(torch.nn.Module):
    def __init__(self, cfg: Config, weights: dict, rope: Rope):
        super().__init__()
        linears = {}
        for name, w in weights.items():
            linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
            linear.weight = torch.nn.Parameter(w, requires_grad=False)
            self.add_module(name, linear)
            linears[name] = linear
        ones = torch.ones(cfg.hidden, dtype=next(iter(weights.values())).dtype,
                          device=next(iter(weights.values())).device)
        self.input_layernorm = torch.nn.Parameter(ones.clone(), requires_grad=False)
        self.post_attention_layernorm = torch.nn.Parameter(ones.clone(), requires_grad=False)
        # A one-layer Stack (a plain object, not a module: the Linears are registered above only).
        self._stack = Stack(cfg, [linears], [(self.input_layernorm, self.post_attention_layernorm)], rope)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._stack.prefill(hidden)


class Decoder(torch.nn.Module):
    """No embedding and no head: the input is the first block's hidden states."""

    def __init__(self, blocks: list):
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            hidden = block(hidden)
        return hidden


def build_model(cfg: Config, dtype, device, seq_len: int, seed: int) -> Decoder:
    rope = Rope(cfg, seq_len, dtype, device)
    return Decoder([DecoderBlock(cfg, w, rope) for w in random_weights(cfg, dtype, device, seed)]).eval()


# The clocks: prune_model's progress stages and the solver's calls.

class Clock:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.events = []  # (time, block index, block name, stage)
        self.calls = []  # (start, end, event index, weight shape, method)

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def progress(self, index: int, total: int, name: str, stage: str) -> None:
        self.events.append((self.now(), index, name, stage))


class TimedNmkit:
    """Stands in for the _nmkit module inside nmkit/prune_model.py: every attribute is the real one's, except
    prune_with_statistics, which is clocked (the solver runs on the host: no device sync is needed around it)."""

    def __init__(self, real, clock: Clock):
        self._real, self._clock = real, clock

    def __getattr__(self, name):
        return getattr(self._real, name)

    def prune_with_statistics(self, weight, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._real.prune_with_statistics(weight, *args, **kwargs)
        t1 = time.perf_counter()
        method = args[3] if len(args) > 3 else kwargs.get("method")
        if self._clock.events:  # the format check before the first stage is not a prune
            self._clock.calls.append((t0, t1, len(self._clock.events) - 1, tuple(weight.shape), method))
        return out


def obs_gflop(rows: int, cols: int) -> float:
    return (2.0 / 3.0 * cols ** 3 + rows * cols ** 2) / 1e9


def breakdown(clock: Clock, wall: float, t_start: float, t_end: float, method: str) -> dict:
    """Per block and per Linear seconds from the stage marks and the solver calls; the parts sum to `wall`."""
    events, calls = clock.events, {c[2]: c for c in clock.calls}
    blocks, capture, linears = {}, 0.0, []
    for i, (t, index, name, stage) in enumerate(events):
        if stage == "done":
            continue
        t_next = events[i + 1][0] if i + 1 < len(events) else t_end
        span = t_next - t
        if stage.startswith("calibration"):
            capture += span
            continue
        b = blocks.setdefault(index, {"block": index, "name": name, "fwd_xtx": 0.0, "to_host": 0.0, "solve": 0.0,
                                      "write_back": 0.0, "rerun": None, "linears": []})
        if stage == "statistics":
            b["fwd_xtx"] += span
        elif stage.startswith("outputs"):
            b["rerun"] = span
        elif stage.startswith("pruning "):
            call = calls.get(i)
            if call is None:  # kept dense (no tokens): the whole span is bookkeeping
                b["write_back"] += span
                continue
            c0, c1, _, shape, _ = call
            part = {"name": stage[len("pruning "):], "shape": list(shape), "to_host": c0 - t, "solve": c1 - c0,
                    "write_back": t_next - c1}
            if method == "obs":
                part["solve_gflops"] = obs_gflop(*shape) / part["solve"]
            b["linears"].append(part)
            linears.append(part)
            for key in ("to_host", "solve", "write_back"):
                b[key] += part[key]
        else:
            raise RuntimeError(f"unknown prune_model stage {stage!r}")
    out = []
    for b in sorted(blocks.values(), key=lambda b: b["block"]):
        b["total"] = b["fwd_xtx"] + b["to_host"] + b["solve"] + b["write_back"] + (b["rerun"] or 0.0)
        out.append(b)
    first = events[0][0] - t_start if events else wall
    done = [t for t, _, _, stage in events if stage == "done"]
    after = t_end - done[-1] if done else 0.0  # closing the progress, restoring the model's mode
    return {"blocks": out, "capture": capture, "before_first_stage": first, "after_done": after, "wall": wall}


def extrapolate(result: dict, blocks: int = BLOCKS_OF_7B) -> dict:
    rows = result["blocks"]
    pool = rows[1:] if len(rows) > 1 else rows
    per = {k: statistics.fmean(b[k] for b in pool) for k in ("fwd_xtx", "to_host", "solve", "write_back")}
    reruns = [b["rerun"] for b in pool if b["rerun"] is not None] or [b["rerun"] for b in rows if b["rerun"]]
    # One block alone has no re-run: the plain forward after prune_model stands in (the same work).
    per["rerun"] = statistics.fmean(reruns) if reruns else result.get("plain_forward", 0.0)
    total = (result["capture"] + result["before_first_stage"]
             + blocks * (per["fwd_xtx"] + per["to_host"] + per["solve"] + per["write_back"])
             + (blocks - 1) * per["rerun"])
    return {"blocks": blocks, "per_block": per, "per_block_total": sum(per.values()), "seconds": total,
            "minutes": total / 60, "from_blocks": [b["block"] for b in pool]}


def plain_forward_seconds(block: torch.nn.Module, batches: list, clock: Clock) -> float:
    with torch.no_grad():
        t0 = clock.now()
        for x in batches:
            block(x)
        return clock.now() - t0


def check_pattern(model: Decoder, fmt: str) -> str:
    """At most N non-zeros in each group of M consecutive entries of every row, for an N:M format."""
    parts = fmt.split(":")
    if len(parts) != 2:
        return "not checked (not N:M)"
    n, m = map(int, parts)
    worst, density = 0, []
    for name, linear in model.named_modules():
        if isinstance(linear, torch.nn.Linear):
            nz = (linear.weight.detach() != 0).view(linear.weight.shape[0], -1, m).sum(-1)
            worst = max(worst, int(nz.max()))
            density.append(float(nz.float().mean()) / m)
    verdict = "ok" if worst <= n else "FAILED"
    return f"{verdict}: at most {worst} non-zeros per group of {m} (mean density {statistics.fmean(density):.3f})"


def timed_torch_solver(real, clock: "Clock"):
    """prune_model's torch OBS (solver="torch"), clocked as the solve: from its call until the device is done."""
    def solve(weight, xtx, n, m, damp):
        t0 = clock.now()
        out = real(weight, xtx, n, m, damp)
        t1 = clock.now()
        clock.calls.append((t0, t1, len(clock.events) - 1, tuple(weight.shape), "obs"))
        return out
    return solve


def run_method(method: str, args, cfg: Config, dtype, device, batches: list) -> dict:
    cuda = device.type == "cuda"
    log(f"{method}: building {args.blocks} blocks")
    model = build_model(cfg, dtype, device, args.seq_len, args.seed)
    clock = Clock(cuda)
    real, real_torch_solver = PRUNE_MODULE._nmkit, PRUNE_MODULE._obs_nm_torch
    PRUNE_MODULE._nmkit = TimedNmkit(real, clock)
    PRUNE_MODULE._obs_nm_torch = timed_torch_solver(real_torch_solver, clock)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        log(f"{method}: prune_model(format={args.format!r}, method={method!r}, solver={args.solver!r})")
        t_start = clock.now()
        weights = nmkit.torch.prune_model(model, None if method == "magnitude" else batches, args.format,
                                          method=method, progress=clock.progress, solver=args.solver)
        t_end = clock.now()
    finally:
        PRUNE_MODULE._nmkit = real
        PRUNE_MODULE._obs_nm_torch = real_torch_solver
    result = breakdown(clock, t_end - t_start, t_start, t_end, method)
    result["method"] = method
    result["pruned_linears"] = len(weights)
    result["solver_calls"] = len(clock.calls)
    result["peak_device_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
    result["pattern"] = check_pattern(model, args.format)
    if method != "magnitude":
        result["plain_forward"] = plain_forward_seconds(model.layers[0], batches, clock)
        for b in result["blocks"]:
            b["xtx_hooks"] = b["fwd_xtx"] - result["plain_forward"]
    result["extrapolation"] = extrapolate(result)
    result["write_back_parts"] = write_back_parts(model, weights, clock)
    log(f"{method}: done in {result['wall']:.1f} s")
    del model, weights
    if cuda:
        torch.cuda.empty_cache()
    return result


def write_back_parts(model: torch.nn.Module, weights: dict, clock: "Clock") -> list:
    """Write-back's parts, timed again after prune_model (its solver threads idle) for one Linear of each shape of
    the last block: the compressed weight to a dense fp32 array, torch.from_numpy, .to(device, dtype), copy_."""
    last = {}
    for name, weight in weights.items():
        if hasattr(weight, "to_dense"):
            last[tuple(weight.shape)] = (name, weight)
    rows = []
    for shape, (name, weight) in sorted(last.items()):
        linear = model.get_submodule(name)
        t0 = clock.now()
        dense = weight.to_dense()
        t1 = clock.now()
        host = torch.from_numpy(dense)
        t2 = clock.now()
        on_device = host.to(device=linear.weight.device, dtype=linear.weight.dtype)
        t3 = clock.now()
        with torch.no_grad():
            linear.weight.copy_(on_device)
        t4 = clock.now()
        rows.append({"name": name, "shape": list(shape), "to_dense": t1 - t0, "from_numpy": t2 - t1,
                     "to_device": t3 - t2, "copy": t4 - t3})
    return rows


def parts_sum(result: dict) -> float:
    return (result["capture"] + result["before_first_stage"] + result["after_done"]
            + sum(b["total"] for b in result["blocks"]))


def sums_to_wall(result: dict) -> bool:
    return math.isclose(parts_sum(result), result["wall"], rel_tol=1e-6, abs_tol=1e-6)


def fmt_s(x) -> str:
    return "-" if x is None else f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def print_report(result: dict, where: str) -> None:
    method = result["method"]
    calibrated = method != "magnitude"
    print(f"\n## {method}: per block (seconds)\n")
    print(f"| block | fwd + X^T X ({where}) | of which X^T X | to host | solve (C++) | write-back | re-run | total |")
    print("|---|---|---|---|---|---|---|---|")
    for b in result["blocks"]:
        fwd = fmt_s(b["fwd_xtx"] if calibrated else None)
        print(f"| {b['block']} | {fwd} | {fmt_s(b.get('xtx_hooks'))} | {fmt_s(b['to_host'])} | "
              f"{fmt_s(b['solve'])} | {fmt_s(b['write_back'])} | {fmt_s(b['rerun'])} | {fmt_s(b['total'])} |")
    print(f"\n{method}: per Linear of the last block (seconds)\n")
    print("| linear | shape | to host | solve | write-back | solve GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for p in result["blocks"][-1]["linears"]:
        gf = f"{p['solve_gflops']:.1f}" if "solve_gflops" in p else "-"
        print(f"| {p['name'].rpartition('.')[2]} | {p['shape'][0]}x{p['shape'][1]} | {fmt_s(p['to_host'])} | "
              f"{fmt_s(p['solve'])} | {fmt_s(p['write_back'])} | {gf} |")
    parts = parts_sum(result)
    print(f"\n{method}: prune_model wall {fmt_s(result['wall'])} s = capture of the first block's inputs "
          f"{fmt_s(result['capture'])} + before the first stage {fmt_s(result['before_first_stage'])} + blocks "
          f"{fmt_s(sum(b['total'] for b in result['blocks']))} + after 'done' {fmt_s(result['after_done'])} "
          f"(sum {fmt_s(parts)}, {'equal' if sums_to_wall(result) else 'DIFFERENT'})")
    if "plain_forward" in result:
        print(f"{method}: plain forward of one block over the calibration (no hooks): "
              f"{fmt_s(result['plain_forward'])} s")
    e = result["extrapolation"]
    per = e["per_block"]
    print(f"{method}: extrapolated to {e['blocks']} blocks (means of blocks {e['from_blocks']}): "
          f"{fmt_s(e['seconds'])} s = {e['minutes']:.2f} min (per block {fmt_s(e['per_block_total'])}: fwd + X^T X "
          f"{fmt_s(per['fwd_xtx'])}, to host {fmt_s(per['to_host'])}, solve {fmt_s(per['solve'])}, write-back "
          f"{fmt_s(per['write_back'])}, re-run {fmt_s(per['rerun'])}); issue 40's target: <= 15 min")
    if result["write_back_parts"]:
        print(f"\n{method}: write-back's parts, again after prune_model (seconds)\n")
        print("| linear | shape | to_dense | from_numpy | .to(device, dtype) | copy_ |")
        print("|---|---|---|---|---|---|")
        for p in result["write_back_parts"]:
            print(f"| {p['name'].rpartition('.')[2]} | {p['shape'][0]}x{p['shape'][1]} | {fmt_s(p['to_dense'])} | "
                  f"{fmt_s(p['from_numpy'])} | {fmt_s(p['to_device'])} | {fmt_s(p['copy'])} |")
    if result["peak_device_bytes"] is not None:
        print(f"{method}: torch.cuda.max_memory_allocated {result['peak_device_bytes'] / 2**30:.1f} GiB")
    print(f"{method}: pattern {result['pattern']}; solver calls timed: {result['solver_calls']} for "
          f"{result['pruned_linears']} pruned Linears")


def environment(device) -> dict:
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
           "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
           "torch_num_threads": torch.get_num_threads(), "os_cpu_count": os.cpu_count(), "usable_cores": _CORES,
           "torch": torch.__version__, "numpy": np.__version__, "nmkit": getattr(nmkit, "__file__", None),
           "python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=None, help="calibration sequences (128; 8 with --tiny)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (2048; 64 with --tiny)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per calibration batch")
    parser.add_argument("--method", nargs="+", default=["obs"], choices=["obs", "wanda", "magnitude"],
                        help="each on a fresh copy of the same model, in order")
    parser.add_argument("--format", default="2:4")
    parser.add_argument("--solver", choices=["auto", "cpu", "torch"], default="auto",
                        help="prune_model's solver (auto: OBS into N:M in torch on a CUDA device, the C++ one otherwise)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="f16 on cuda, f32 on the CPU")
    parser.add_argument("--tiny", action="store_true", help="hidden 256, 4 heads, FFN 688 (the dry run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("prune_model_time: no CUDA device (use --device cpu --tiny for the dry run)")
    args.sequences = args.sequences or (8 if args.tiny else 128)
    args.seq_len = args.seq_len or (64 if args.tiny else 2048)
    dtype = DTYPES[args.dtype or ("f16" if device.type == "cuda" else "f32")]
    if args.blocks < 1 or args.sequences < 1 or args.batch < 1 or args.sequences % args.batch:
        sys.exit("prune_model_time: --blocks, --sequences and --batch must be >= 1, --sequences a multiple of --batch")
    cfg = Config(layers=args.blocks, **(TINY if args.tiny else LLAMA2_7B))
    env = environment(device)
    log("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    log(f"model: {args.blocks} blocks, hidden {cfg.hidden}, {cfg.heads} heads of {cfg.head_dim}, FFN {cfg.ffn}, "
        f"{str(dtype).replace('torch.', '')} on {device}; calibration {args.sequences} x {args.seq_len} tokens of "
        f"random hidden states, {args.batch} per batch; format {args.format}")

    generator = torch.Generator(device=device).manual_seed(args.seed + 1)
    batches = [torch.randn(args.batch, args.seq_len, cfg.hidden, generator=generator, device=device).to(dtype)
               for _ in range(args.sequences // args.batch)]
    report = {"config": {"blocks": args.blocks, "sequences": args.sequences, "seq_len": args.seq_len,
                         "batch": args.batch, "format": args.format, "dtype": str(dtype), "device": str(device),
                         "hidden": cfg.hidden, "heads": cfg.heads, "ffn": cfg.ffn, "tiny": args.tiny,
                         "calibration": "random normal hidden states (timing only)"},
              "environment": env, "methods": []}
    for method in args.method:
        result = run_method(method, args, cfg, dtype, device, batches)
        result["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        report["methods"].append(result)
        print_report(result, "GPU" if device.type == "cuda" else str(device))
        print(f"{method}: peak host RSS so far {result['peak_host_rss_bytes'] / 2**30:.1f} GiB", flush=True)
        if args.json:  # after each method, so that a run cut short keeps what finished
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    for r in report["methods"]:
        if not sums_to_wall(r):
            sys.exit(f"prune_model_time: {r['method']}: the parts do not sum to the wall time")
        if r["solver_calls"] != r["pruned_linears"]:
            sys.exit(f"prune_model_time: {r['method']}: {r['solver_calls']} solver calls timed for "
                     f"{r['pruned_linears']} pruned Linears")
        if r["pattern"].startswith("FAILED"):
            sys.exit(f"prune_model_time: {r['method']}: {r['pattern']}")


if __name__ == "__main__":
    main()
