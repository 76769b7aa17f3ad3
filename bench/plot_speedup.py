#!/usr/bin/env python3
"""Plots speed-up over dense cuBLAS per shape (nmkit and cuSPARSELt) from nmkit_bench's JSON.

Usage: plot_speedup.py bench.json speedup.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(json_path, png_path):
    data = json.load(open(json_path))
    rows = data["rows"]
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(max(8, len(rows) * 0.45), 4.5 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        sel = [r for r in rows if r["dtype"] == dtype]
        labels = [f'{r["suite"]}\n{r["r"]}x{r["k"]}x{r["c"]}' for r in sel]
        x = range(len(sel))
        ax.bar([i - 0.2 for i in x], [r["speedup_vs_cublas"] for r in sel], 0.4, label="nmkit")
        # cuSPARSELt's searched configuration where its product checked out; its default one (hatched) where the
        # search picked a configuration whose product was wrong (docs/performance.md, the note under the 2:4 table).
        searched, default = [], []
        for i, r in zip(x, sel):
            if "cusparselt_ms" in r:
                (searched if r.get("cusparselt_searched", True) else default).append((i, r["cublas_ms"] / r["cusparselt_ms"]))
        if searched:
            ax.bar([i + 0.2 for i, _ in searched], [v for _, v in searched], 0.4, color="tab:orange", label="cuSPARSELt (searched)")
        if default:
            ax.bar([i + 0.2 for i, _ in default], [v for _, v in default], 0.4, color="white", edgecolor="tab:orange",
                   hatch="//", label="cuSPARSELt (default configuration)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(2.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7, rotation=90)
        ax.set_ylabel("speed-up over cuBLAS")
        ax.set_title(f'2:4 SpMM, {dtype}, {data.get("gpu", "")}')
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
