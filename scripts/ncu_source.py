#!/usr/bin/env python3
"""Summarises an Nsight Compute source page (`ncu --import R --page source --print-source sass --csv`, as
scripts/gpu_profile.sh writes it, gzipped or not): where a kernel's warps spend their time, from the stall samples.

  ncu_source.py PAGE                       stall reasons and opcodes over the whole kernel
  ncu_source.py PAGE --top N               the N instructions with the most samples, with their top stall reasons
  ncu_source.py PAGE --range A B           the same summary over SASS rows A..B (row numbers as --top prints them)
  ncu_source.py PAGE --lines SASS          samples per source line; SASS is `nvdisasm -g -c` of a cubin built with the
                                           same flags (-lineinfo), for the profiled kernel only (offsets must match)

Samples count warp time: each sample is one warp's state at one moment, so a region's share of samples is its share
of the warps' time (producer and consumer warps together).
"""
import argparse
import collections
import csv
import gzip
import re

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header = rows[1]  # rows[0] names the kernel
    index = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    return rows[0], rows[2:], index, stalls


def count(row, index, column):
    return int(row[index[column]] or 0)


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summary(rows, index, stalls, total, label):
    reasons = collections.Counter()
    by_opcode, executed = collections.Counter(), collections.Counter()
    for row in rows:
        for name in stalls:
            reasons[name] += count(row, index, name)
        op = opcode(row[index["Source"]])
        by_opcode[op] += count(row, index, SAMPLES)
        executed[op] += count(row, index, EXECUTED)
    samples = sum(count(row, index, SAMPLES) for row in rows)
    print(f"{label}: {len(rows)} instructions, {100 * samples / total:.1f} % of the samples")
    reason_total = sum(reasons.values()) or 1
    for name, value in reasons.most_common(8):
        print(f"  {name[len('stall_'):]:20s} {100 * value / reason_total:5.1f} %")
    print("  opcode       samples  executed")
    all_executed = sum(executed.values()) or 1
    for op, value in by_opcode.most_common(16):
        print(f"  {op:10s} {100 * value / total:7.1f} % {100 * executed[op] / all_executed:7.1f} %  ({executed[op]})")


def top(rows, index, stalls, total, n):
    order = sorted(range(len(rows)), key=lambda i: -count(rows[i], index, SAMPLES))
    for i in order[:n]:
        row = rows[i]
        reasons = sorted(((count(row, index, name), name[len("stall_"):]) for name in stalls), reverse=True)[:3]
        text = " ".join(f"{name}:{value}" for value, name in reasons if value)
        print(f"{i:6d} {100 * count(row, index, SAMPLES) / total:5.2f} % ex={count(row, index, EXECUTED):>10d} "
              f"{row[index['Source']].strip()[:64]:64s} {text}")


def by_line(rows, index, total, sass_path, n):
    offsets, where = {}, None
    with open(sass_path) as f:
        for text in f:
            m = re.search(r'//## File "([^"]+)", line (\d+)', text)
            if m:
                where = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
                continue
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/", text)
            if m:
                offsets[int(m.group(1), 16)] = where
    base = int(rows[0][index["Address"]], 16)
    samples, executed = collections.Counter(), collections.Counter()
    for row in rows:
        where = offsets.get(int(row[index["Address"]], 16) - base, "?")
        samples[where] += count(row, index, SAMPLES)
        executed[where] += count(row, index, EXECUTED)
    for where, value in samples.most_common(n):
        print(f"{100 * value / total:5.2f} % ex={executed[where]:>10d} {where}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page")
    parser.add_argument("--top", type=int)
    parser.add_argument("--range", type=int, nargs=2, metavar=("A", "B"))
    parser.add_argument("--lines", metavar="SASS")
    args = parser.parse_args()
    kernel, rows, index, stalls = load(args.page)
    total = sum(count(row, index, SAMPLES) for row in rows) or 1
    if args.top:
        top(rows, index, stalls, total, args.top)
    elif args.lines:
        by_line(rows, index, total, args.lines, 40)
    elif args.range:
        summary(rows[args.range[0]:args.range[1] + 1], index, stalls, total, f"rows {args.range[0]}..{args.range[1]}")
    else:
        print(kernel[1] if len(kernel) > 1 else kernel[0])
        summary(rows, index, stalls, total, "kernel")


if __name__ == "__main__":
    main()
