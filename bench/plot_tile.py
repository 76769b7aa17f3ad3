#!/usr/bin/env python3
"""Plots the tile suite of nmkit_bench like seed 003's chart: speed-up over dense cuBLAS against density, one
line per tile size (and kernel), with the cuSPARSE baselines (BSR dotted, Blocked-ELL dashed where the pattern
allows it), one panel per batch size C and distribution of tiles over rows, one row of panels per dtype.

Usage: plot_tile.py bench.json tile_speedup.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(json_path, png_path):
    rows = [r for r in json.load(open(json_path))["rows"] if r.get("suite") == "tile"]
    if not rows:
        return
    # One row of panels per dtype, one column per (C, distribution).
    dtypes = sorted({r["dtype"] for r in rows})
    columns = sorted({(r["c"], r["distribution"]) for r in rows})
    fig, axes = plt.subplots(len(dtypes), len(columns), figsize=(5 * len(columns), 4.2 * len(dtypes)), squeeze=False)
    panels = [(axes[i][j], c, distribution, dtype) for i, dtype in enumerate(dtypes) for j, (c, distribution) in enumerate(columns)]
    for ax, c, distribution, dtype in panels:
        sel = [r for r in rows if (r["c"], r["distribution"], r["dtype"]) == (c, distribution, dtype)]
        for tile in sorted({r["tile"] for r in sel}):
            line = sorted((r for r in sel if r["tile"] == tile), key=lambda r: r["density"])
            xs = [r["density"] for r in line]
            ax.plot(xs, [r["speedup_vs_cublas"] for r in line], "o-", label=f"{tile}x{tile} {line[0]['kernel']}")
            if all("cusparse_bsr_ms" in r for r in line):
                ax.plot(xs, [r["cublas_ms"] / r["cusparse_bsr_ms"] for r in line], ":", label=f"{tile}x{tile} cuSPARSE BSR")
            ell = [r for r in line if "cusparse_blocked_ell_ms" in r]  # only where the pattern allows it
            if ell:
                ax.plot([r["density"] for r in ell], [r["cublas_ms"] / r["cusparse_blocked_ell_ms"] for r in ell], "x--",
                        label=f"{tile}x{tile} cuSPARSE Blocked-ELL")
        dens = sorted({r["density"] for r in sel})
        ax.plot(dens, [1 / d for d in dens], color="gray", linewidth=0.8, label="limit 1/density")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(dens, [f"{d:g}" for d in dens])  # the suite's densities, not log-scale minor labels
        ax.minorticks_off()
        ax.set_xlabel("density (fraction of tiles kept)")
        ax.set_ylabel("speed-up over cuBLAS")
        ax.set_title(f"4096x4096 weight, C={c}, {distribution}, {dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
