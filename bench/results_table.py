#!/usr/bin/env python3
"""Prints nmkit_bench JSON as the markdown table used in docs/performance.md.

Usage: results_table.py bench.json [more.json ...]
"""
import json
import sys


def schedule(row):
    """The sm90 kernel's schedule as the plan printed it in nmkit_config (docs/gpu.md)."""
    config = row.get("nmkit_config", "")
    if "sm90" not in config:
        return "-"
    if "persistent" in config:
        return "persistent"
    return "registers" if "register epilogue" in config else "staged"


def main(paths):
    print("| suite | R x K x C | dtype | cuBLAS TFLOP/s | cuSPARSELt TFLOP/s (x cuBLAS) | nmkit TFLOP/s | nmkit x cuBLAS | nmkit x cuSPARSELt | schedule | rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        data = json.load(open(path))
        for r in data["rows"]:
            flop = 2.0 * r["r"] * r["k"] * r["c"]
            tf = lambda ms: flop / (ms * 1e-3) / 1e12
            lt = (f'{tf(r["cusparselt_ms"]):.0f} ({r["cublas_ms"] / r["cusparselt_ms"]:.2f}x)' if "cusparselt_ms" in r else "n/a")
            if "cusparselt_ms" in r and r.get("cusparselt_searched") is False:
                lt += " default cfg*"
            vs_lt = f'{r["nmkit_vs_cusparselt"]:.2f}x' if "nmkit_vs_cusparselt" in r else "n/a"
            print(f'| {r["suite"]} | {r["r"]}x{r["k"]}x{r["c"]} | {r["dtype"]} | {tf(r["cublas_ms"]):.0f} | {lt} | '
                  f'{tf(r["nmkit_ms"]):.0f} | {r["speedup_vs_cublas"]:.2f}x | {vs_lt} | {schedule(r)} | {r["nmkit_rel_error"]:.1e} |')


if __name__ == "__main__":
    main(sys.argv[1:])
