#!/usr/bin/env python3
"""Elastic jobs: lspawn against torchrun on the same command line, in one run.

Three launchers on 127.0.0.1 act as three nodes of `--nnodes 2:3 --nproc-per-node 1
--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --max-restarts 3`, each running
bench/multinode/jobs/elastic_job.py (torch.distributed, gloo, CPU). The command line is the
same for both launchers; only the first word differs (`python -m torch.distributed.run` or
`lspawn`), and lspawn is given the interpreter (`lspawn ... PYTHON job.py`).

Scenarios:
  lost   3 nodes run; 1 s after rank 0's first all_reduce in the world of 3, the third node dies
         (its launcher and every process under it are SIGKILLed at once, as when a machine goes
         away). Measured: from the kill to rank 0's first all_reduce in the world of 2 (the
         survivors' next round: detection, stopping, re-rendezvous, worker start, init).
  join   2 nodes run (formed after last_call_timeout); 1 s after rank 0's first all_reduce in
         the world of 2 a third launcher is started. Measured: from its start to rank 0's first
         all_reduce in the world of 3.
Both launchers get the same --rdzv-conf last_call_timeout (--last-call, default torchrun's 30 s).

Every repetition runs each launcher once per scenario, alternating which goes first. Prints a
markdown table: median (min-max) seconds, and lspawn's time as a fraction of torchrun's; the exit
codes of the launchers that lived (0 expected), and how many runs reached the new world within
the limit (120 s + last_call after the change; a run that did not is named on stderr, and the
logs of every run are kept). Usage:
  python3 bench/multinode/elastic.py --build build [--python .deps/torch2/bin/python]
                                     [--reps 3] [--last-call 30] [--scenarios lost,join]
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "bench", "multinode", "jobs", "elastic_job.py")
LINE = re.compile(r"ELASTIC round=(\d+) world=(\d+) t=([0-9.]+)")


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ports import free_port  # noqa: E402  (bench/ports.py: reserved, held until exit)


def descendants(pid):
    """pid and every process under it (from /proc), deepest last."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class Node:
    def __init__(self, cmd, env, logdir, name):
        self.out_path = os.path.join(logdir, name + ".out")
        self.err_path = os.path.join(logdir, name + ".err")
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"),
                                     start_new_session=True)

    def output(self):
        with open(self.out_path) as f:
            return f.read()

    def kill_node(self):
        """SIGKILL the launcher and everything under it at once: the node is gone."""
        for p in descendants(self.proc.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.kill_node()


def first_line(nodes, world, after=0.0):
    for n in nodes:
        for m in LINE.finditer(n.output()):
            if int(m.group(2)) == world and float(m.group(3)) >= after:
                return float(m.group(3))
    return None


def wait_for(pred, timeout, nodes):
    """pred()'s first value that is not None, within `timeout`; None once every node exited."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v is not None:
            return v
        if all(n.proc.poll() is not None for n in nodes):
            return pred()
        time.sleep(0.02)
    return None


def run_once(launcher, scenario, args, logdir):
    port = free_port()
    flags = ["--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", f"elastic{port}", "--max-restarts", "3",
             "--rdzv-conf", f"last_call_timeout={args.last_call}"]
    if launcher == "torchrun":
        cmd = [args.python, "-m", "torch.distributed.run"] + flags + [JOB]
    else:
        cmd = [os.path.join(args.build, "launcher", "lspawn"), "--quiet"] + flags + [args.python, JOB]
    # The launchers' temporary files (torchrun's torchelastic_* log directories, which it leaves;
    # the run directory of the lspawn killed as a machine dies) go with the benchmark's.
    tmp = os.path.join(logdir, f"tmp-{launcher}-{scenario}-{port}")
    os.makedirs(tmp)
    env = dict(os.environ, TMPDIR=tmp, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               ELASTIC_FINAL_WORLD="2" if scenario == "lost" else "3",
               LSPAWN_JOB_SECRET="e1a571c0e1a571c0e1a571c0e1a571c0")
    tag = f"{launcher}-{scenario}-{port}"
    nodes = []
    try:
        first = 3 if scenario == "lost" else 2
        for i in range(first):
            nodes.append(Node(cmd, env, logdir, f"{tag}-{i}"))
            time.sleep(0.3)  # join order: node 0 hosts the rendezvous
        if wait_for(lambda: first_line(nodes, first), 120 + args.last_call, nodes) is None:
            return None, f"no world of {first} ({tag})"
        time.sleep(1.0)
        t0 = time.time()
        if scenario == "lost":
            nodes[2].kill_node()
            alive, want = nodes[:2], 2
        else:
            nodes.append(Node(cmd, env, logdir, f"{tag}-2"))
            alive, want = nodes, 3
        t = wait_for(lambda: first_line(alive, want, t0), 120 + args.last_call, alive)
        try:
            codes = [n.proc.wait(timeout=180) for n in alive]
        except subprocess.TimeoutExpired:
            return None, f"launchers still running 180 s after the change ({tag})"
        if t is None:
            return None, f"no world of {want} after the change ({tag}; exit codes {codes})"
        return (t - t0, codes), None
    finally:
        for n in nodes:
            n.stop()


def stats(xs):
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def fmt(s):
    return "n/a" if s is None else f"{s[0]:.2f} ({s[1]:.2f}-{s[2]:.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default=os.path.join(ROOT, ".deps", "torch2", "bin", "python"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--last-call", type=int, default=30)  # torchrun takes whole seconds only
    ap.add_argument("--scenarios", default="lost,join")
    args = ap.parse_args()
    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    if not torch_version:
        sys.exit(f"elastic.py: {args.python} cannot import torch (bash scripts/setup-torch2.sh)")
    scenarios = args.scenarios.split(",")
    results = {(s, l): [] for s in scenarios for l in ("torchrun", "lspawn")}
    codes = {k: [] for k in results}
    runs = {k: 0 for k in results}
    problems = []
    with tempfile.TemporaryDirectory(prefix="lspawn-elastic-bench-") as logdir:
        for rep in range(args.reps):
            for s in scenarios:
                order = ("torchrun", "lspawn") if rep % 2 == 0 else ("lspawn", "torchrun")
                for launcher in order:
                    r, problem = run_once(launcher, s, args, logdir)
                    runs[(s, launcher)] += 1
                    if problem:
                        problems.append(problem)
                        print(f"# rep {rep} {s} {launcher}: {problem}", file=sys.stderr, flush=True)
                        continue
                    results[(s, launcher)].append(r[0])
                    codes[(s, launcher)].extend(r[1])
                    print(f"# rep {rep} {s} {launcher}: {r[0]:.2f} s, exit codes {r[1]}", file=sys.stderr, flush=True)
        if problems:
            keep = tempfile.mkdtemp(prefix="lspawn-elastic-bench-logs-")
            subprocess.run(["cp", "-r", logdir + "/.", keep])
            print(f"# logs of every run kept in {keep}", file=sys.stderr)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, torch {torch_version}, {os.cpu_count()} CPUs, "
          f"load {' '.join(load)}, --nnodes 2:3, 1 rank per node, last_call_timeout {args.last_call} s, "
          f"{args.reps} reps")
    print("| scenario | torchrun (s) | lspawn (s) | lspawn / torchrun | runs that got there, torchrun / lspawn "
          "| exit codes torchrun / lspawn |")
    print("|---|---|---|---|---|---|")
    names = {"lost": "node lost: kill -> first all_reduce of the 2 left",
             "join": "node joins: its start -> first all_reduce of the 3"}
    for s in scenarios:
        t, l = stats(results[(s, "torchrun")]), stats(results[(s, "lspawn")])
        ratio = f"{l[0] / t[0]:.2f}x" if t and l else "n/a"
        cset = lambda k: ",".join(str(c) for c in sorted(set(codes[k]))) or "-"
        got = f"{len(results[(s, 'torchrun')])}/{runs[(s, 'torchrun')]} / {len(results[(s, 'lspawn')])}/{runs[(s, 'lspawn')]}"
        print(f"| {names[s]} | {fmt(t)} | {fmt(l)} | {ratio} | {got} | {cset((s, 'torchrun'))} / {cset((s, 'lspawn'))} |")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
