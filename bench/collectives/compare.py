#!/usr/bin/python3
"""Merges collectives benchmark results (lspawn JSON arrays, JSON-lines from torch_dist_bench.py
and mpi_bench), prints a side-by-side table of bus bandwidth with ratios, and writes the merged
JSON and a plot of bus bandwidth against size for each implementation.

    compare.py --json merged.json --plot busbw.png FILE...
"""
import argparse
import json
from collections import defaultdict

IMPLS = ["lspawn-shm", "lspawn-gloo", "torch-gloo", "openmpi"]


def load(path):
    with open(path) as f:
        text = f.read().strip()
    if not text:
        return []
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def human(b):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b // size} {unit}"
    return f"{b} B"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--plot")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    rows = [r for f in a.files for r in load(f)]
    table = defaultdict(dict)  # (op, nprocs, bytes) -> impl -> row
    for r in rows:
        table[(r["op"], r["nprocs"], r["bytes"])][r["impl"]] = r
    impls = [i for i in IMPLS if any(i in v for v in table.values())]
    impls += sorted({i for v in table.values() for i in v} - set(impls))

    head = f"{'op':<11} {'N':>2} {'size':>9} " + " ".join(f"{i + ' us':>16} {'busbw':>7}" for i in impls)
    ratios = [("lspawn-shm", "torch-gloo"), ("lspawn-shm", "openmpi"), ("lspawn-shm", "lspawn-gloo")]
    ratios = [(x, y) for x, y in ratios if x in impls and y in impls]
    head += "".join(f" {x.split('-')[-1] + '/' + y:>16}" for x, y in ratios)
    print("\n# bus bandwidth in GB/s; ratios are busbw ratios (>1: first is faster)")
    print(head)
    for key in sorted(table):
        op, n, b = key
        line = f"{op:<11} {n:>2} {human(b):>9} "
        cells = []
        for i in impls:
            r = table[key].get(i)
            cells.append(f"{r['time_us']:>16.1f} {r['busbw_gbs']:>7.3f}" if r else f"{'-':>16} {'-':>7}")
        line += " ".join(cells)
        for x, y in ratios:
            rx, ry = table[key].get(x), table[key].get(y)
            line += f" {ry['time_us'] / rx['time_us']:>16.2f}" if rx and ry else f" {'-':>16}"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ops = sorted({k[0] for k in table})
        ns = sorted({k[1] for k in table})
        fig, axes = plt.subplots(len(ops), len(ns), figsize=(6 * len(ns), 4 * len(ops)), squeeze=False)
        for oi, op in enumerate(ops):
            for ni, n in enumerate(ns):
                ax = axes[oi][ni]
                for impl in impls:
                    pts = sorted((k[2], v[impl]["busbw_gbs"]) for k, v in table.items()
                                 if k[0] == op and k[1] == n and impl in v)
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=impl)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_title(f"{op}, {n} ranks")
                ax.set_xlabel("bytes per rank")
                ax.set_ylabel("bus bandwidth (GB/s)")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=90)
        print(f"\nwrote {a.plot}")


if __name__ == "__main__":
    main()
