#!/usr/bin/env python3
"""Per-row medians of an A/B made by scripts/gpu_ab.sh: nmkit's speed-up over cuBLAS on this tree and on the reference,
each the median over the runs that have the row, and their ratio.

Usage: ab_medians.py DIR [--floor 0.97]   (DIR holds <n>.this.json and <n>.ref.json)

Each speed-up is measured inside one process, in the same rounds as its cuBLAS; the two builds ran one after the
other in the same call. Exits with 1 when a row's ratio is under the floor, 2 when the files cannot be read.
"""
import argparse
import glob
import os
import statistics
import sys

from median_ratios import collect, row_label


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--floor", type=float, default=0.97, help="lowest this/ref ratio that passes")
    args = parser.parse_args()
    this_paths = sorted(glob.glob(os.path.join(args.dir, "*.this.json")))
    ref_paths = sorted(glob.glob(os.path.join(args.dir, "*.ref.json")))
    if not this_paths or not ref_paths:
        print(f"{args.dir}: no <n>.this.json / <n>.ref.json pairs", file=sys.stderr)
        return 2
    try:
        this, ref = collect(this_paths), collect(ref_paths)
    except (OSError, ValueError, KeyError) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"# runs: this {len(this_paths)}, reference {len(ref_paths)}; medians of nmkit's speed-up over cuBLAS")
    print(f"{'suite':<7} {'shape':<58} {'dtype':<5} {'runs':>5} {'this':>8} {'ref':>8} {'this/ref':>9}")
    worst, failed = None, 0
    for key, rows in this.items():
        if key not in ref:
            continue
        suite, shape, dtype = row_label(key)
        a = statistics.median(r["speedup_vs_cublas"] for r in rows)
        b = statistics.median(r["speedup_vs_cublas"] for r in ref[key])
        ratio = a / b
        worst = ratio if worst is None else min(worst, ratio)
        flag = "" if ratio >= args.floor else "  < floor"
        failed += ratio < args.floor
        print(f"{suite:<7} {shape:<58} {dtype:<5} {len(rows):>2}/{len(ref[key]):<2} {a:>7.2f}x {b:>7.2f}x {ratio:>9.3f}{flag}")
    if worst is None:
        print("no row is in both builds' results", file=sys.stderr)
        return 2
    print(f"# worst this/ref {worst:.3f}; {failed} row(s) under {args.floor}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
