#!/usr/bin/env python3
"""The `models` suite of nmkit_bench (`--suite models`) in brief: per dtype, the rows at or above cuBLAS, the rows
at or above cuSPARSELt (where it ran), and the geometric mean speed-up over cuBLAS at T <= 64 (decode and small
batches) and over all rows; with a second argument, also a plot of nmkit's speed-up over cuBLAS against T, one line
per weight shape (cuSPARSELt dashed).

Usage: plot_models.py bench.json [models.png]
"""
import json
import math
import sys
from collections import defaultdict

SMALL_BATCH = 64


def series(rows):
    """{(dtype, R, K): [(T, nmkit x cuBLAS, cuSPARSELt x cuBLAS or None), ...]}, sorted by T."""
    by_shape = defaultdict(list)
    for r in rows:
        if r.get("suite") != "models":
            continue
        lt = r["cublas_ms"] / r["cusparselt_ms"] if r.get("cusparselt_ms") else None
        by_shape[(r["dtype"], r["r"], r["k"])].append((r["c"], r["speedup_vs_cublas"], lt))
    return {key: sorted(points) for key, points in by_shape.items()}


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(lines):
    out = []
    for dtype in sorted({key[0] for key in lines}):
        points = [p for key, ps in lines.items() if key[0] == dtype for p in ps]
        with_lt = [p for p in points if p[2] is not None]
        out.append(
            f"{dtype}: {len(points)} rows, {sum(p[1] >= 1.0 for p in points)} at or above cuBLAS, "
            f"{sum(p[1] >= p[2] for p in with_lt)} of {len(with_lt)} at or above cuSPARSELt; geometric mean over "
            f"cuBLAS {geometric_mean([p[1] for p in points if p[0] <= SMALL_BATCH]):.3f}x at T <= {SMALL_BATCH}, "
            f"{geometric_mean([p[1] for p in points]):.3f}x over all")
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
        ax.set_ylabel("speed-up over cuBLAS (dashed: cuSPARSELt)")
        ax.set_title(f"2:4 on every model linear, {dtype}")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)


def main(json_path, png_path=None):
    lines = series(json.load(open(json_path))["rows"])
    if not lines:
        sys.exit(f"{json_path}: no rows of the models suite")
    print("\n".join(summary(lines)))
    if png_path:
        plot(lines, png_path)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
