#!/usr/bin/env python3
"""Python jobs, launch to exit: lspawn against torchrun on the same scripts, in one run (issue #21).

Jobs (bench/launch/jobs/), torch 2.x on the CPU (gloo), N ranks on one node:
  hello      init_process_group("gloo"), all_reduce (checked), barrier, exit
  lightning  Lightning DDP (strategy="ddp", CPU), a tiny linear model, 8 optimizer steps

Launchers:
  torchrun           python -m torch.distributed.run --nproc_per_node N --master_port P job.py
  lspawn exec        lspawn --nprocs N python job.py            (one interpreter per rank, as torchrun)
  lspawn preload     lspawn --preload MODULES --nprocs N python job.py
                     (one interpreter imports MODULES, the ranks are forked from it; MODULES = torch,
                     and torch,lightning for the Lightning job)
  lspawn warm        the same with --warm: the preloaded interpreter kept by lspawn's daemon between
                     runs; its first run is reported apart, the timed runs are the ones after it
  lspawn exec+hang   (--with-hang) lspawn --nprocs N python -m lspawn_hang job.py: exec with the Python
                     hang diagnosis (python/lspawn_hang.py) recording every collective: its cost
The preload and warm modes switch on when `lspawn --help` lists --preload / --warm.

Every repetition runs each mode once, in a rotating order (paired, interleaved: the machine's state is
shared by the modes); the table gives medians (min-max) in wall seconds and each mode's time as a
fraction of torchrun's (the issue's goal: <= 0.4x for both jobs; warm hello < 1 s). Usage:
  python3 bench/launch/python_jobs.py --build build-torch2 [--python .deps/torch2/bin/python]
                                      [--reps 5] [--nprocs 2,4] [--jobs hello,lightning] [--with-hang]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import free_port, timed  # noqa: E402  (bench/launch/run.py: the launch benchmark's helpers)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(ROOT, "bench", "launch", "jobs")
SCRIPTS = {"hello": os.path.join(JOBS, "hello.py"), "lightning": os.path.join(JOBS, "lightning_fit.py")}
PRELOAD = {"hello": "torch", "lightning": "torch,lightning"}


def stats(samples):
    return (statistics.median(samples), min(samples), max(samples)) if samples else None


def fmt(s):
    return "n/a" if s is None else f"{s[0]:.2f} ({s[1]:.2f}-{s[2]:.2f})"


class Launchers:
    def __init__(self, build, python, daemon_socket, with_hang=False):
        self.with_hang = with_hang
        self.lspawn = os.path.join(build, "launcher", "lspawn")
        self.python = python
        if not os.access(self.lspawn, os.X_OK):
            sys.exit(f"python_jobs.py: {self.lspawn} is missing: build the lspawn target first")
        if subprocess.run([python, "-c", "import torch, lightning"], capture_output=True).returncode != 0:
            sys.exit(f"python_jobs.py: {python} cannot import torch and lightning (bash scripts/setup-torch2.sh)")
        help_text = subprocess.run([self.lspawn, "--help"], capture_output=True, text=True).stdout
        self.has_preload = "--preload" in help_text
        self.has_warm = self.has_preload and "--warm" in help_text
        self.warm_socket_flag = "--daemon-socket" in help_text
        self.daemon_socket = daemon_socket

    def modes(self):
        m = ["torchrun", "exec"]
        if self.with_hang:
            m.append("exec-hang")
        if self.has_preload:
            m.append("preload")
        if self.has_warm:
            m.append("warm")
        return m

    def cmd(self, mode, job, n):
        script = SCRIPTS[job]
        if mode == "torchrun":
            return [self.python, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                    "--master_port", str(free_port()), script]
        base = [self.lspawn, "--quiet", "--nprocs", str(n)]
        if mode == "exec":
            return base + [self.python, script]
        if mode == "exec-hang":
            return base + [self.python, "-m", "lspawn_hang", script]
        if mode == "preload":
            return base + ["--preload", PRELOAD[job], self.python, script]
        if mode == "warm":
            extra = ["--daemon-socket", self.daemon_socket] if self.warm_socket_flag else []
            return base + ["--preload", PRELOAD[job], "--warm"] + extra + [self.python, script]
        raise ValueError(mode)


def bench(launchers, job, n, reps, env):
    modes = launchers.modes()
    samples = {m: [] for m in modes}
    first_warm = None
    if "warm" in modes:  # the daemon's first run of this program: starts its preloaded interpreter
        first_warm = timed(launchers.cmd("warm", job, n), env, timeout=600)
    for rep in range(reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for m in order:
            samples[m].append(timed(launchers.cmd(m, job, n), env, timeout=600))
    return {m: stats(s) for m, s in samples.items()}, first_warm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".deps", "torch2", "bin", "python"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--jobs", default="hello,lightning")
    ap.add_argument("--with-hang", action="store_true", help="also lspawn exec + python -m lspawn_hang")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if a.with_hang:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        launchers = Launchers(os.path.abspath(a.build), a.python, os.path.join(d, "daemon.sock"), a.with_hang)
        daemon = None
        if launchers.has_warm and launchers.warm_socket_flag:
            log = open(os.path.join(d, "daemon.log"), "w")
            daemon = subprocess.Popen([launchers.lspawn, "daemon", "--socket", launchers.daemon_socket],
                                      stdout=log, stderr=log)
            for _ in range(500):
                if os.path.exists(launchers.daemon_socket):
                    break
                time.sleep(0.01)
        try:
            modes = launchers.modes()
            print(f"# Python jobs, launch to exit — {os.uname().nodename}, {os.cpu_count()} cores, "
                  f"{a.python}; median (min-max) wall seconds of {a.reps} paired runs per mode; "
                  f"modes: {', '.join(modes)}\n")
            names = {"torchrun": "torchrun", "exec": "lspawn (exec)", "exec-hang": "lspawn (exec) -m lspawn_hang",
                     "preload": "lspawn --preload", "warm": "lspawn --preload --warm"}
            head = "| job | N | " + " | ".join(names[m] for m in modes) + " | " + \
                   " | ".join(f"{names[m]} / torchrun" for m in modes if m != "torchrun")
            if "warm" in modes:
                head += " | warm: the daemon's first run"
            ncols = 2 + 2 * len(modes) - 1 + (1 if "warm" in modes else 0)
            print(head + " |")
            print("|" + "---|" * ncols)
            for job in a.jobs.split(","):
                for n in [int(x) for x in a.nprocs.split(",")]:
                    try:
                        r, first = bench(launchers, job, n, a.reps, env)
                    except RuntimeError as e:
                        print(f"# {job} N={n} failed: {e}", file=sys.stderr)
                        continue
                    tr = r["torchrun"][0]
                    line = f"| {job} | {n} | " + " | ".join(fmt(r[m]) for m in modes) + " | " + \
                           " | ".join(f"{r[m][0] / tr:.2f}x" for m in modes if m != "torchrun")
                    if "warm" in modes:
                        line += f" | {first:.2f}"
                    print(line + " |")
                    sys.stdout.flush()
        finally:
            if daemon:
                daemon.terminate()
                daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
