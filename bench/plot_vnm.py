#!/usr/bin/env python3
"""Plots the vnm suite of nmkit_bench (like VENOM's Figures 13/14 and 9).

vnm_speedup.png: speed-up over dense cuBLAS against sparsity 1 - 2/M (log scale), one panel per shape and
dtype, one line per V and B layout, the fixed-index ablation ("ideal") dashed, the operation-count limit M/2
dotted. vnm_gather.png: what gathering B costs against the ablation, per M. vnm_k.png (when the run swept K
at fixed R and C, `--vnm-shapes ksweep`): speed-up against K per pattern, gathered and fixed indices (Figure 9).

Usage: plot_vnm.py vnm.json OUT_DIR
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(json_path, out_dir):
    rows = [r for r in json.load(open(json_path))["rows"] if r.get("suite") == "vnm"]
    if not rows:
        return
    panels = sorted({(r["r"], r["k"], r["c"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (r, k, c, dtype) in zip(axes[0], panels):
        sel = [x for x in rows if (x["r"], x["k"], x["c"], x["dtype"]) == (r, k, c, dtype)]
        ms = sorted({x["m"] for x in sel})
        ax.plot([1 - 2 / m for m in ms], [m / 2 for m in ms], ":", color="gray", label="limit M/2")
        for v in sorted({x["v"] for x in sel}):
            for layout in sorted({x["b_layout"] for x in sel}):
                line = sorted((x for x in sel if x["v"] == v and x["b_layout"] == layout), key=lambda x: x["m"])
                ax.plot([1 - 2 / x["m"] for x in line], [x["speedup_vs_cublas"] for x in line], "o-",
                        label=f"V={v}, B {layout}")
            ideal = sorted((x for x in sel if x["v"] == v and x["b_layout"] == sel[0]["b_layout"] and "ideal_ms" in x),
                           key=lambda x: x["m"])
            ax.plot([1 - 2 / x["m"] for x in ideal], [x["ideal_speedup_vs_cublas"] for x in ideal], "--",
                    label=f"V={v}, fixed indices (ideal)")
        ax.set_xscale("logit")
        ax.set_yscale("log")
        ax.set_xticks([1 - 2 / m for m in ms])
        ax.set_xticklabels([f"2:{m}" for m in ms], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("pattern (axis: sparsity 1 - 2/M)")
        ax.set_ylabel("speed-up over cuBLAS")
        ax.set_title(f"{r}x{k}x{c} {dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "vnm_speedup.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(7, 4))
    for (r, k, c, dtype) in panels:
        for layout in sorted({x["b_layout"] for x in rows}):
            line = sorted((x for x in rows if (x["r"], x["k"], x["c"], x["dtype"], x["b_layout"]) == (r, k, c, dtype, layout)
                           and x["v"] == max(y["v"] for y in rows) and "gather_cost" in x), key=lambda x: x["m"])
            ax.plot([x["m"] for x in line], [100 * x["gather_cost"] for x in line], "o-", label=f"{r}x{k}x{c} {dtype} B {layout}")
    ax.axhline(10, color="gray", linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("M")
    ax.set_ylabel("gather cost vs fixed indices (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "vnm_gather.png"), dpi=110)

    sweeps = {}
    for x in rows:
        sweeps.setdefault((x["r"], x["c"], x["dtype"], x["b_layout"]), set()).add(x["k"])
    sweeps = {key: ks for key, ks in sweeps.items() if len(ks) >= 3}
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.2), squeeze=False)
        for ax, ((r, c, dtype, layout), _) in zip(axes[0], sorted(sweeps.items())):
            sel = [x for x in rows if (x["r"], x["c"], x["dtype"], x["b_layout"]) == (r, c, dtype, layout)]
            for v, m in sorted({(x["v"], x["m"]) for x in sel}):
                line = sorted((x for x in sel if (x["v"], x["m"]) == (v, m)), key=lambda x: x["k"])
                p = ax.plot([x["k"] for x in line], [x["speedup_vs_cublas"] for x in line], "o-", label=f"{v}:2:{m}")
                ax.plot([x["k"] for x in line], [x["ideal_speedup_vs_cublas"] for x in line], "--", color=p[0].get_color())
            ax.set_xscale("log", base=2)
            ax.set_xlabel("K")
            ax.set_ylabel("speed-up over cuBLAS (dashed: fixed indices)")
            ax.set_title(f"{r} x K x {c} {dtype}, B {layout}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "vnm_k.png"), dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
