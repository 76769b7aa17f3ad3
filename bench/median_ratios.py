#!/usr/bin/env python3
"""Per-row medians of the side-by-side ratios over repeated nmkit_bench runs (2:4 suites' JSON).

A single run's ratio against cuSPARSELt moves by a few per cent from run to run (identical configurations timed in
the same rounds differed by up to 5 %: docs/performance.md, 2:4 item 31), so an acceptance line such as "nmkit >=
cuSPARSELt on every shape" is judged on the median of several runs, each ratio still measured within its own run.

Usage: median_ratios.py run1.json run2.json [...]   (scripts/gpu_check.sh with NMKIT_BENCH_REPEAT=N writes them)

Prints one markdown row per (suite, shape, dtype): the runs that have it, the median nmkit x cuBLAS, the median
nmkit x cuSPARSELt with its range (over the runs whose searched configuration passed the check; "default cfg" where
every run fell back to cuSPARSELt's default configuration, its searched one having failed the check), and, for runs made with --variant-env, the median of the variant's time
over nmkit's. Exits with 1 when a file cannot be read, has no rows, or a row lacks a field it needs.
"""
import json
import statistics
import sys


def row_key(row):
    return (row["suite"], row["r"], row["k"], row["c"], row["dtype"])


def collect(paths):
    """{key: [row of run 1, row of run 2, ...]} in the order the rows first appear."""
    rows = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if not data.get("rows"):
            raise ValueError(f"{path}: no benchmark rows")
        for row in data["rows"]:
            rows.setdefault(row_key(row), []).append(row)
    return rows


def summary(runs):
    """The medians of one row over its runs, as table cells."""
    vs_cublas = statistics.median(r["speedup_vs_cublas"] for r in runs)
    timed = [r for r in runs if "nmkit_vs_cusparselt" in r]
    searched = [r["nmkit_vs_cusparselt"] for r in timed if r.get("cusparselt_searched") is not False]
    default = [r["nmkit_vs_cusparselt"] for r in timed if r.get("cusparselt_searched") is False]
    # The two baselines are different kernels: the searched one where any run has it, the default one otherwise.
    lt = searched or default
    if lt:
        vs_lt = f"{statistics.median(lt):.3f}x ({min(lt):.3f}-{max(lt):.3f})"
        if not searched:
            vs_lt += " default cfg"
        elif default:
            vs_lt += f" searched in {len(searched)} of {len(timed)} runs"
    else:
        vs_lt = "n/a"
    variant = [r["variant_ms"] / r["nmkit_ms"] for r in runs if "variant_ms" in r]
    variant_cell = f"{statistics.median(variant):.3f}x" if variant else "n/a"
    return len(runs), f"{vs_cublas:.2f}x", vs_lt, variant_cell


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:  # a row without the fields nmkit_bench writes is named by its missing field, not a traceback
        table = [(key, summary(runs)) for key, runs in collect(paths).items()]
    except (OSError, ValueError, KeyError) as e:
        print(f"median_ratios: {e!r}" if isinstance(e, KeyError) else f"median_ratios: {e}", file=sys.stderr)
        return 1
    print("| suite | R x K x C | dtype | runs | nmkit x cuBLAS | nmkit x cuSPARSELt, median (range) | variant's time x nmkit's |")
    print("|---|---|---|---|---|---|---|")
    for (suite, r, k, c, dtype), (n, vs_cublas, vs_lt, variant) in table:
        print(f"| {suite} | {r}x{k}x{c} | {dtype} | {n} | {vs_cublas} | {vs_lt} | {variant} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
