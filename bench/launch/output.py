#!/usr/bin/env python3
"""Chatty workers: how fast each launcher passes N ranks' output to the console, attributed to the
rank, and whether every line arrives whole (lspawn against torchrun 2.15 and Open MPI, in one run).

Every launcher runs the same program on N ranks of one node:
  /bin/sh -c 'yes "rank R step 000 loss=0.123456 lr=0.001 ..." | head -n LINES'
(about 64 bytes a line), its stdout into a file; stderr is kept apart for errors.

Modes:
  lspawn            lspawn --nprocs N                       every line "[rank R] ..." (lspawn's default)
  lspawn template   ... --log-line-prefix-template '[${role_name}${local_rank}]:'   (torchrun's form)
  lspawn tmpl+dup   ... and --duplicate-stdout-filters loss= --log-dir D (every line also to D's
                    filtered_stdout.log; lspawn's files only, so --tee for the console)
  torchrun tee      torchrun --standalone --no-python --nproc-per-node N --tee 3
                    --log-line-prefix-template '[${role_name}${local_rank}]:' (torchrun prefixes tee'd
                    streams only: without --tee its workers write to the console directly, unattributed)
  torchrun tee+dup  ... and --duplicate-stdout-filters loss= (torchrun's filtered_stdout.log)
  torchrun plain    torchrun without --tee: no prefix, the workers' own fds (the unattributed floor)
  mpirun tag        mpirun -np N --tag-output (Open MPI's "[1,R]<stdout>:" prefix)

Each mode runs with LINES and with 1 line per rank (the launcher's start and stop, no output), in a
rotating order, --reps times; the table gives the medians of both, the output rate
N*LINES / (t_LINES - t_1) in lines per second, and whether the console file held every one of the
N*LINES lines whole, in every repetition (a line cut in two by a prefix inserted mid-line, as Open
MPI's --tag-output does at its read boundaries, is not whole). Usage:
  python3 bench/launch/output.py --build build [--python .deps/torch2/bin/python] [--nprocs 2]
                                 [--lines 400000] [--reps 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LINE = "rank R step 000 loss=0.123456 lr=0.001 grad_norm=1.000 tokens/s=123456"
TEMPLATE = "[${role_name}${local_rank}]:"


def program(lines):
    rank = "${RANK:-$OMPI_COMM_WORLD_RANK}"
    return ["/bin/sh", "-c", f'yes "{LINE.replace("rank R", "rank " + rank)}" | head -n {lines}']


class Modes:
    def __init__(self, build, python, nprocs, scratch):
        self.lspawn = os.path.join(build, "launcher", "lspawn")
        self.python = python
        self.n = nprocs
        self.scratch = scratch
        if not os.access(self.lspawn, os.X_OK):
            sys.exit(f"output.py: {self.lspawn} is missing: build the lspawn target first")
        have_torch = subprocess.run([python, "-c", "import torch.distributed.run"], capture_output=True).returncode == 0
        self.names = ["lspawn", "lspawn template", "lspawn tmpl+dup"]
        if have_torch:
            self.names += ["torchrun tee", "torchrun tee+dup", "torchrun plain"]
        else:
            print(f"# {python} cannot import torch: torchrun modes left out (bash scripts/setup-torch2.sh)")
        if shutil.which("mpirun"):
            self.names.append("mpirun tag")

    def cmd(self, mode, lines):
        n = str(self.n)
        logs = tempfile.mkdtemp(prefix="logs-", dir=self.scratch)
        if mode.startswith("lspawn"):
            c = [self.lspawn, "--quiet", "--nprocs", n]
            if mode != "lspawn":
                c += ["--log-line-prefix-template", TEMPLATE]
            if mode == "lspawn tmpl+dup":
                c += ["--duplicate-stdout-filters", "loss=", "--log-dir", logs, "--tee"]
            return c + program(lines)
        if mode.startswith("torchrun"):
            c = [self.python, "-m", "torch.distributed.run", "--standalone", "--no-python", "--nproc-per-node", n,
                 "--log-dir", logs]
            if mode != "torchrun plain":
                c += ["--tee", "3", "--log-line-prefix-template", TEMPLATE]
            if mode == "torchrun tee+dup":
                c += ["--duplicate-stdout-filters", "loss="]
            return c + program(lines)
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", n, "--tag-output"] + \
            program(lines)

    def run(self, mode, lines):
        """Wall seconds, and how many of the n*lines program lines reached the console file whole."""
        out_path = os.path.join(self.scratch, "console")
        env = dict(os.environ, TMPDIR=self.scratch, LOGLEVEL="WARNING")
        with open(out_path, "wb") as out:
            t0 = time.perf_counter()
            p = subprocess.run(self.cmd(mode, lines), stdout=out, stderr=subprocess.PIPE, env=env, timeout=600)
            dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{mode}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}")
        got = 0
        with open(out_path, "rb") as f:
            for line in f:
                got += b"loss=0.123456" in line
        return dt, got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default=".deps/torch2/bin/python")
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--lines", type=int, default=400000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="lspawn-bench-output-")
    try:
        m = Modes(a.build, a.python, a.nprocs, scratch)
        full, empty, complete = {k: [] for k in m.names}, {k: [] for k in m.names}, {k: True for k in m.names}
        want = a.nprocs * a.lines
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {os.cpu_count()} CPUs, load "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {a.nprocs} ranks x {a.lines} lines "
              f"({len(LINE) + 1} bytes each before the prefix), {a.reps} reps, modes rotated")
        for rep in range(a.reps):
            order = m.names[rep % len(m.names):] + m.names[:rep % len(m.names)]
            for mode in order:
                dt, got = m.run(mode, a.lines)
                full[mode].append(dt)
                complete[mode] = complete[mode] and got == want
                if got != want:
                    print(f"# {mode}: rep {rep}: {got} of {want} lines whole on the console")
                empty[mode].append(m.run(mode, 1)[0])
        print()
        print("| mode | wall, N x LINES (s) | wall, N x 1 line (s) | output rate (lines/s) | every line whole |")
        print("|---|---|---|---|---|")
        rate = {}
        for mode in m.names:
            f, e = statistics.median(full[mode]), statistics.median(empty[mode])
            rate[mode] = want / (f - e) if f > e else float("inf")
            shown = f"{rate[mode] / 1e6:.2f} M" if f > e else "not measurable (within the start's spread)"
            print(f"| {mode} | {f:.2f} ({min(full[mode]):.2f}-{max(full[mode]):.2f}) | {e:.2f} | "
                  f"{shown} | {'yes' if complete[mode] else 'NO'} |")
        for a_mode, b_mode in (("lspawn template", "torchrun tee"), ("lspawn tmpl+dup", "torchrun tee+dup"),
                               ("lspawn", "mpirun tag")):
            if a_mode in rate and b_mode in rate:
                print(f"# output rate {a_mode} / {b_mode}: {rate[a_mode] / rate[b_mode]:.1f}x")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
