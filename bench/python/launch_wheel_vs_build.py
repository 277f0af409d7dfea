"""The wheel's `lspawn` against the CMake build's, side by side (docs/benchmarks.md §12).

    python bench/python/launch_wheel_vs_build.py WHEEL_LSPAWN BUILD_LSPAWN [RUNS]

Times, interleaved, RUNS times each (default 30): `lspawn --version`, and `lspawn --nprocs 8
/bin/true` (start 8 workers, supervise, reap). Prints median and min per binary. The wheel's
binary is stripped and links libstdc++ statically; the build's is RelWithDebInfo and dynamic.
"""
import os
import statistics
import subprocess
import sys
import time


def once(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    wheel, build = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    cases = [("--version", ["--version"]), ("--nprocs 8 /bin/true", ["--nprocs", "8", "--quiet", "/bin/true"])]
    bins = [("wheel", wheel), ("CMake build", build)]
    times = {(c, b): [] for c, _ in cases for b, _ in bins}
    for _ in range(runs):
        for c, args in cases:
            for b, path in bins:
                times[(c, b)].append(once([path] + args))
    print("%d runs each, interleaved, %d cores; wheel: %s; build: %s" % (runs, os.cpu_count(), wheel, build))
    print("| command | lspawn | median ms | min ms |")
    print("|---|---|---|---|")
    for c, _ in cases:
        for b, _ in bins:
            t = times[(c, b)]
            print("| `lspawn %s` | %s | %.2f | %.2f |" % (c, b, 1000 * statistics.median(t), 1000 * min(t)))


if __name__ == "__main__":
    main()
