#!/usr/bin/env python3
"""Log-log plots of store.py's JSON lines (docs/scale-store.md): init_s and the server's CPU
against W, one line per (build label, mode), medians over repetitions, with each line's slope.

  $(bash bench/scale/setup-plot.sh) bench/scale/plot_store.py RESULTS.jsonl OUT_DIR
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import slope  # noqa: E402  (the same least-squares fit as run.py's tables)


def main(path, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(path) if line.strip()]
    os.makedirs(out, exist_ok=True)
    for metric, what in (("init_s", "W ranks' store start (set, barrier, 8 peers' gets)"),
                         ("server_cpu_s", "the store host's CPU")):
        by = {}
        for r in rows:
            if r.get("metric") == metric:
                key = (r.get("label") or r.get("torch", ""), r["tool"])
                by.setdefault(key, {}).setdefault(r["W"], []).append(float(r["value"]))
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for (label, tool), ws in sorted(by.items()):
            pts = sorted((w, statistics.median(v)) for w, v in ws.items() if statistics.median(v) > 0)
            if len(pts) < 2:
                continue
            s = slope(pts)
            ax.loglog([w for w, _ in pts], [v for _, v in pts], marker="o",
                      linestyle="--" if "before" in label else "-", label=f"{label} {tool} (slope {s:.2f})")
        ax.set_xlabel("simulated ranks W")
        ax.set_ylabel("s")
        ax.set_title(what, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"store_{metric}.svg"))
        plt.close(fig)
        print(os.path.join(out, f"store_{metric}.svg"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
