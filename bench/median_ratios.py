#!/usr/bin/env python3
"""Per-row medians of the side-by-side ratios over repeated nmkit_bench runs (the JSON of any suite).

A single run's ratio against cuSPARSELt moves by a few per cent from run to run (identical configurations timed in
the same rounds differed by up to 5 %: docs/performance.md, 2:4 items 31-32), so an acceptance line such as "nmkit
>= cuSPARSELt on every shape" is judged on the median of several runs, each ratio still measured within its own run.

Usage: median_ratios.py run1.json run2.json [...]   (scripts/gpu_check.sh with NMKIT_BENCH_REPEAT=N writes them)

Prints one markdown row per suite, shape and dtype (and, in the vnm and tile suites, pattern: V, M, B's layout,
tile, density, distribution): the runs that have it, the median nmkit x cuBLAS, the median nmkit x cuSPARSELt with
its range (over the runs whose searched configuration passed the check; "default cfg" where every run fell back to
cuSPARSELt's default configuration, its searched one having failed the check), the median of a --variant
plan's time over nmkit's, and where rows have them the medians of the fixed-index ablation and the full 2:4 form
over cuBLAS (vnm) and of nmkit over cuSPARSE BSR (tile). Exits with 1 when a file cannot be read, has no rows, or
a row lacks a field it needs.
"""
import json
import statistics
import sys


# What else names a row of the V:N:M and tile suites (a shape and dtype carry several patterns there).
IDENTITY_FIELDS = ("v", "m", "b_layout", "shared_columns", "tile", "density", "distribution")
# Further per-suite ratios, each with its median when any row has it.
EXTRA_RATIOS = (("ideal_speedup_vs_cublas", "fixed indices x cuBLAS"), ("full_2_4_speedup_vs_cublas", "full 2:4 x cuBLAS"),
                ("nmkit_vs_cusparse_bsr", "nmkit x cuSPARSE BSR"))


def row_key(row):
    identity = tuple((f, row[f]) for f in IDENTITY_FIELDS if f in row)
    return (row["suite"], row["r"], row["k"], row["c"], row["dtype"], identity)


def row_label(key):
    suite, r, k, c, dtype, identity = key
    shape = f"{r}x{k}x{c}" + "".join(f" {f}={v}" for f, v in identity)
    return suite, shape, dtype


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
    extras = []
    for field, _ in EXTRA_RATIOS:
        values = [r[field] for r in runs if r.get(field) is not None]
        extras.append(f"{statistics.median(values):.2f}x" if values else "n/a")
    return [len(runs), f"{vs_cublas:.2f}x", vs_lt, variant_cell], extras


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:  # a row without the fields nmkit_bench writes is named by its missing field, not a traceback
        table = [(key, summary(runs)) for key, runs in collect(paths).items()]
    except (OSError, ValueError, KeyError) as e:
        print(f"median_ratios: {e!r}" if isinstance(e, KeyError) else f"median_ratios: {e}", file=sys.stderr)
        return 1
    # Only the extra columns that some row has.
    shown = [i for i in range(len(EXTRA_RATIOS)) if any(extras[i] != "n/a" for _, (_, extras) in table)]
    header = ["suite", "R x K x C", "dtype", "runs", "nmkit x cuBLAS", "nmkit x cuSPARSELt, median (range)",
              "variant's time x nmkit's"] + [EXTRA_RATIOS[i][1] for i in shown]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for key, (cells, extras) in table:
        print("| " + " | ".join([*row_label(key), *map(str, cells), *(extras[i] for i in shown)]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
