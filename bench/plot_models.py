#!/usr/bin/env python3
"""The `models` suite of nmkit_bench (`--suite models`) in brief: per dtype, the rows at or above cuBLAS, the rows
at or above cuSPARSELt (searched), the geometric mean speed-up over cuBLAS at T <= 64 (decode and small batches)
and over all rows, and the rows under each baseline by name; with --png, also a plot of nmkit's speed-up over cuBLAS
against T, one line per weight shape (cuSPARSELt dashed). cuSPARSELt counts where its searched configuration
ran and its output passed the check (rows where only its default one did are left out).

Several files are one suite measured in parts (`nmkit_bench --resume`, or --models / --tokens subsets) and in
repeated runs: a row that several files hold takes the median of its runs' ratios (each ratio measured inside one
run). Files from different GPUs are refused.

Usage: plot_models.py RUN.json [RUN.json ...] [--png models.png]
"""
import argparse
import json
import math
import statistics
import sys
from collections import defaultdict

SMALL_BATCH = 64


def load_rows(paths):
    """The models rows of every file, refusing a mix of GPUs."""
    rows, gpus = [], {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        if "gpu" in run:
            gpus[path] = run["gpu"]
        rows += [r for r in run.get("rows", []) if r.get("suite") == "models"]
    if len(set(gpus.values())) > 1:
        sys.exit("runs from different GPUs: " + ", ".join(f"{p} ({g})" for p, g in gpus.items()))
    return rows


def series(rows):
    """{(dtype, R, K): [(T, nmkit x cuBLAS, cuSPARSELt x cuBLAS or None, runs), ...]}, sorted by T; a row held by
    several runs takes the median of each ratio over them (cuSPARSELt's over the runs where its searched
    configuration ran)."""
    runs = defaultdict(list)
    for r in rows:
        # cuSPARSELt's searched configuration only: where its output failed the check the row times its default
        # one, which is no fair baseline (the acceptance's "searched, where its product is correct").
        searched = r.get("cusparselt_ms") and r.get("cusparselt_searched", True)
        lt = r["cublas_ms"] / r["cusparselt_ms"] if searched else None
        runs[(r["dtype"], r["r"], r["k"], r["c"])].append((r["speedup_vs_cublas"], lt))
    by_shape = defaultdict(list)
    for (dtype, rows_, k, t), measured in runs.items():
        lts = [lt for _, lt in measured if lt is not None]
        by_shape[(dtype, rows_, k)].append(
            (t, statistics.median(m for m, _ in measured), statistics.median(lts) if lts else None, len(measured)))
    return {key: sorted(points) for key, points in by_shape.items()}


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(lines):
    out = []
    for dtype in sorted({key[0] for key in lines}):
        points = [(r, k) + p for (d, r, k), ps in sorted(lines.items()) if d == dtype for p in ps]
        with_lt = [p for p in points if p[4] is not None]
        counts = sorted({p[5] for p in points})
        runs = "" if counts == [1] else f" (medians of {counts[0]}-{counts[-1]} runs a row)"
        out.append(
            f"{dtype}: {len(points)} rows{runs}, {sum(p[3] >= 1.0 for p in points)} at or above cuBLAS, "
            f"{sum(p[3] >= p[4] for p in with_lt)} of {len(with_lt)} at or above cuSPARSELt (searched); "
            f"geometric mean over cuBLAS {geometric_mean([p[3] for p in points if p[2] <= SMALL_BATCH]):.3f}x "
            f"at T <= {SMALL_BATCH}, {geometric_mean([p[3] for p in points]):.3f}x over all")
        under = [f"{r}x{k}x{t} {m:.2f}x" for r, k, t, m, _, _ in points if m < 1.0]
        if under:
            out.append(f"  under cuBLAS ({len(under)}): " + ", ".join(under))
        under_lt = [f"{r}x{k}x{t} {m:.2f}x against {lt:.2f}x" for r, k, t, m, lt, _ in with_lt if m < lt]
        if under_lt:
            out.append(f"  under cuSPARSELt ({len(under_lt)}): " + ", ".join(under_lt))
    return out


def plot(lines, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({key[0] for key in lines})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7.5 * len(dtypes), 5.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        for (d, r, k), points in sorted(lines.items()):
            if d != dtype:
                continue
            t = [p[0] for p in points]
            (line,) = ax.plot(t, [p[1] for p in points], marker="o", markersize=3, label=f"{r}x{k}")
            lt = [(p[0], p[2]) for p in points if p[2] is not None]
            if lt:
                ax.plot([p[0] for p in lt], [p[1] for p in lt], linestyle="--", color=line.get_color(), alpha=0.5)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("speed-up over cuBLAS (dashed: cuSPARSELt, searched)")
        ax.set_title(f"2:4 on every model linear, {dtype}")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)


def main():
    parser = argparse.ArgumentParser(description="Summarise (and plot) nmkit_bench --suite models runs.")
    parser.add_argument("runs", nargs="+", help="nmkit_bench JSON files: parts and repeated runs of the suite")
    parser.add_argument("--png", help="also plot the speed-ups against T here")
    args = parser.parse_args()
    lines = series(load_rows(args.runs))
    if not lines:
        sys.exit(f"{', '.join(args.runs)}: no rows of the models suite")
    print("\n".join(summary(lines)))
    if args.png:
        plot(lines, args.png)


if __name__ == "__main__":
    main()
