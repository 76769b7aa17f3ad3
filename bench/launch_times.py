#!/usr/bin/env python3
"""How each library's launch times move through a row's timing (nmkit_bench --launch-times).

The H200's clocks fall from boost under sustained load within the first tens of milliseconds, so the launches of a
row's first rounds can be 6-25 % faster than the rest (twenty-sixth session). This prints, per row and library, the
median of the first round's launches, the median of the second half of the launches (the settled state) and their
ratio, which shows whether a row was timed across that fall (docs/performance.md, "How a row is timed").

Usage: launch_times.py run.json [...]   (JSON written by nmkit_bench with --launch-times)

Exits with 1 when a file cannot be read or has no row with launch times.
"""
import json
import statistics
import sys

LAUNCHES_PER_ROUND = 4  # kLaunchesPerRound in bench/gpu/bench_common.hpp


def row_lines(path):
    with open(path) as f:
        data = json.load(f)
    rows = [r for r in data.get("rows", []) if r.get("launch_ms")]
    if not rows:
        raise ValueError(f"{path}: no rows with launch_ms (run nmkit_bench with --launch-times)")
    for row in rows:
        for library, times in row["launch_ms"].items():
            if len(times) < 2 * LAUNCHES_PER_ROUND:
                raise ValueError(f"{path}: {library} has {len(times)} launches, fewer than two rounds")
            first = statistics.median(times[:LAUNCHES_PER_ROUND])
            settled = statistics.median(times[len(times) // 2:])
            yield (f"| {row['r']}x{row['k']}x{row['c']} | {row['dtype']} | {library} | {len(times)} | {first:.4f} | "
                   f"{settled:.4f} | {settled / first:.3f}x |")


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        lines = [line for path in paths for line in row_lines(path)]
    except (OSError, ValueError, KeyError) as e:
        print(f"launch_times: {e!r}" if isinstance(e, KeyError) else f"launch_times: {e}", file=sys.stderr)
        return 1
    print("| R x K x C | dtype | library | launches | first round ms (median) | second half ms (median) | settled / first |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
